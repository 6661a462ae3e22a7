-- resty.ffi.grpc: a non-blocking gRPC client for OpenResty and nginx-lua.
--
-- Protobuf, JSON mapping and gRPC semantics run in the grpc-wasm module
-- (the same .wasm that Envoy loads), hosted by liblua_shim.so, which also
-- does HTTP/2 and TLS. This file is glue: Lua tables go in and come out as
-- JSON (cjson), and a coroutine waits on an ngx.semaphore that a cosocket
-- reader posts when the native side has news. Two ways in: LuaJIT's FFI
-- (the default, whenever it runs: always in OpenResty), or lua-resty-ffi's
-- runtime when asked for (mode = "resty_ffi"); on the FFI path a
-- connection's bytes go through a cosocket of its own (the default) or
-- through the shim's runtime thread.

local ffi = require("ffi")
local cjson = require("cjson.safe")
local semaphore = require("ngx.semaphore")

local C
local ngx = ngx
local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber
local setmetatable = setmetatable
local concat = table.concat
local ffi_string, ffi_new, ffi_gc = ffi.string, ffi.new, ffi.gc

local _M = { _VERSION = "0.1.0" }

ffi.cdef [[
typedef struct {
    int kind;
    int http_status;
    const char *body;
    size_t body_len;
    const char *headers;
    size_t headers_len;
    int code;
    int resumed;
} grpc_wasm_event;

const char *grpc_wasm_last_error(void);
int grpc_wasm_init(const char *module_path, const char *cache_dir, const char *socket_dir);
const char *grpc_wasm_socket_path(void);
int grpc_wasm_ready(uint32_t *out, int max);
int grpc_wasm_loadfile(const char *path, const char *include);
int grpc_wasm_load_descriptor_set(const char *data, size_t len);
int grpc_wasm_set_print_options(const char *json, size_t len);
int grpc_wasm_connect(const char *addr, const char *host, const char *ca, const char *cert, const char *key,
                      int64_t keepalive_ms, int64_t keepalive_timeout_ms, int64_t handshake_timeout_ms);
int grpc_wasm_set_max_queued_bytes(int64_t bytes);
void grpc_wasm_conn_close(uint32_t conn);
int grpc_wasm_start(uint32_t conn, const char *path, size_t path_len, const char *body, size_t body_len,
                    int64_t timeout_ms, const char *metadata, size_t metadata_len, const char *json_options);
int grpc_wasm_send(uint32_t id, const char *json, size_t len);
int grpc_wasm_close_send(uint32_t id);
int grpc_wasm_next_event(uint32_t id, grpc_wasm_event *out);
void grpc_wasm_close(uint32_t id);
int grpc_wasm_wire_connect(const char *addr, const char *host, const char *ca, const char *cert, const char *key,
                           int64_t keepalive_ms, int64_t keepalive_timeout_ms, int64_t handshake_timeout_ms);
int grpc_wasm_wire_tick(uint32_t conn, uint32_t *out, int max, int64_t *next_ms);
int grpc_wasm_wire_input(uint32_t conn, const char *data, size_t len, uint32_t *out, int max);
const char *grpc_wasm_wire_output(uint32_t conn, size_t *len);
int grpc_wasm_wire_reset(uint32_t conn, const char *reason, uint32_t *out, int max);
int grpc_wasm_wire_pending(uint32_t conn);
]]

local DEFAULT_TIMEOUT = 10000 -- ms; every call ends by its deadline
-- The shim's defaults (ms), for the cosocket's own connect timeout.
local DEFAULT_HANDSHAKE_TIMEOUT = 10000
local settings = {}
local waiters = {} -- call id -> semaphore
-- Semaphores of finished calls, for the next ones: a call then allocates none.
local spare_semas, n_spare = {}, 0
local event = ffi_new("grpc_wasm_event[1]")
local ready_ids = ffi_new("uint32_t[256]")

local function last_error()
    return ffi_string(C.grpc_wasm_last_error())
end

local function dirname(path)
    return path:match("^(.*)/[^/]*$") or "."
end

-- The first readable file among patterns such as package.cpath's.
local function search(patterns, name)
    for pattern in patterns:gmatch("[^;]+") do
        local path = pattern:gsub("%?", name)
        local f = io.open(path, "rb")
        if f then
            f:close()
            return path
        end
    end
    return nil
end

-- An environment variable, "" counting as unset (nginx's `env NAME=;`).
local function getenv(name)
    local v = os.getenv(name)
    if v == "" then
        return nil
    end
    return v
end

local function find_shim()
    local path = settings.shim or getenv("GRPC_WASM_SHIM") or search(package.cpath, "liblua_shim")
    if not path then
        return nil, "liblua_shim.so not found: set GRPC_WASM_SHIM, grpc.init{shim = path} or package.cpath"
    end
    return path
end

-- The module, sought the same way on both paths; a missing one is named
-- with where it was sought, as the native side could only say "failed".
local function find_module(shim)
    local path, from = settings.module, "grpc.init{module = ...}"
    if not path then
        path, from = getenv("GRPC_WASM_MODULE"), "GRPC_WASM_MODULE"
    end
    if not path then
        path, from = dirname(shim) .. "/grpc_wasm.wasm", "next to the shim " .. shim
    end
    local f, err = io.open(path, "rb")
    if not f then
        return nil, "grpc_wasm.wasm not found: " .. tostring(err) .. " (sought " .. from
            .. "; set grpc.init{module = path} or GRPC_WASM_MODULE)"
    end
    f:close()
    return path
end

-- Wakes the calls whose ids are the first n of ids.
local function post_ready(ids, n)
    for i = 0, n - 1 do
        local sema = waiters[ids[i]]
        if sema then
            sema:post(1)
        end
    end
end

-- The semaphores of ready calls are posted from here: one light thread per
-- worker reading the socket the native side writes a byte to.
local function reader(premature, path)
    if premature then
        return
    end
    local sock = ngx.socket.tcp()
    -- The native side writes a heartbeat byte every 0.5 s: a read that
    -- times out means the native side is gone.
    sock:settimeouts(1000, 1000, 5000)
    local ok, err = sock:connect("unix:" .. path)
    if not ok then
        ngx.log(ngx.ERR, "grpc-wasm: cannot connect the wake-up socket ", path, ": ", err)
    end
    -- An exiting worker keeps reading while calls wait, so that calls in
    -- flight end when their events come; the heartbeat brings it back
    -- here to see when none is left.
    while ok and (not ngx.worker.exiting() or next(waiters) ~= nil) do
        local data, rerr = sock:receiveany(4096)
        if not data then
            ngx.log(ngx.ERR, "grpc-wasm: wake-up socket: ", rerr)
            break
        end
        while true do
            local n = C.grpc_wasm_ready(ready_ids, 256)
            post_ready(ready_ids, n)
            if n < 256 then
                break
            end
        end
    end
    sock:close()
    if not ngx.worker.exiting() then
        ngx.timer.at(0.01, reader, path)
    end
end

-- The compiled-module cache: nil lets the shim pick its private default
-- directory; false (or "") disables the cache.
local function cache_dir()
    local dir = settings.cache_dir
    if dir == nil then
        dir = os.getenv("GRPC_WASM_CACHE_DIR")
    end
    if dir == false then
        return ""
    end
    return dir
end

-- Path (b): LuaJIT FFI into liblua_shim.so, woken through the socket.
local ffi_backend = {}

function ffi_backend.init()
    local shim, err = find_shim()
    if not shim then
        return nil, err
    end
    local ok, lib = pcall(ffi.load, shim)
    if not ok then
        return nil, "cannot load " .. shim .. ": " .. tostring(lib)
    end
    local module, merr = find_module(shim)
    if not module then
        return nil, merr
    end
    C = lib
    if C.grpc_wasm_init(module, cache_dir(), settings.socket_dir) ~= 0 then
        return nil, last_error()
    end
    if C.grpc_wasm_set_max_queued_bytes(settings.max_queued_bytes or 0) ~= 0 then
        return nil, last_error()
    end
    local path = C.grpc_wasm_socket_path()
    if path == nil then
        return nil, last_error()
    end
    local tok, terr = ngx.timer.at(0, reader, ffi_string(path))
    if not tok then
        return nil, "cannot start the wake-up reader: " .. terr
    end
    return true
end

local function status(rc)
    if rc ~= 0 then
        return nil, last_error()
    end
    return true
end

function ffi_backend.loadfile(path, include)
    return status(C.grpc_wasm_loadfile(path, include and concat(include, "\n") or nil))
end

function ffi_backend.load_descriptor_set(bytes)
    return status(C.grpc_wasm_load_descriptor_set(bytes, #bytes))
end

function ffi_backend.set_json_options(json)
    return status(C.grpc_wasm_set_print_options(json, #json))
end

-- Cosocket connections: HTTP/2 and TLS run in the shim, on this thread;
-- a timer per connection owns its socket and moves the bytes (one light
-- thread reads, one writes). A call then never leaves nginx's thread.
local pumps = {} -- conn id -> pump
local call_pumps = {} -- call id -> pump

-- The longest timeout a cosocket takes (lua-nginx-module refuses more
-- than 2^31-1 ms): about 24 days.
local MAX_TIMEOUT = 2147483647

local function pump_reset(pump, reason)
    local n = C.grpc_wasm_wire_reset(pump.id, reason, pump.ids, 256)
    if n > 0 then
        post_ready(pump.ids, n)
    end
    return n >= 0
end

-- Reads until the socket fails; returns why.
local function pump_reader(pump, sock)
    local ids = ffi_new("uint32_t[256]")
    while true do
        local data, err = sock:receiveany(65536)
        if not data then
            if err ~= "timeout" then
                pump.broken = err
                pump.wake:post(1)
                return
            end
        else
            pump.active = ngx.now()
            local n = C.grpc_wasm_wire_input(pump.id, data, #data, ids, 256)
            if n < 0 then
                pump.broken = last_error()
                pump.wake:post(1)
                return
            end
            post_ready(ids, n)
            -- HTTP/2's own answers (acks, window updates), or its end.
            if C.grpc_wasm_wire_pending(pump.id) ~= 0 then
                pump.wake:post(1)
            end
        end
    end
end

local IDLE = {} -- pump_writer's answer for a connection idle too long
local swept = false

-- Whether a pump keeps its connection: until the conn is closed and, once
-- the worker exits (a reload, a graceful stop), while calls are open on
-- it, so that calls in flight end as their server answers. One full
-- collection first closes the calls no one holds any more.
local function pump_serves(pump)
    if pump.closed then
        return false
    end
    if not ngx.worker.exiting() then
        return true
    end
    if not swept then
        swept = true
        collectgarbage()
    end
    return pump.calls > 0
end
local next_ms = ffi_new("int64_t[1]")

-- The shim's keepalive clock: PINGs, and the end of a connection whose
-- server does not answer. Returns how long to wait at most (s).
local function pump_tick(pump)
    local n = C.grpc_wasm_wire_tick(pump.id, pump.ids, 256, next_ms)
    if n > 0 then
        post_ready(pump.ids, n)
    end
    local ms = tonumber(next_ms[0])
    if n < 0 or ms < 0 or ms >= 1000 then
        return 1
    end
    -- A wait under a millisecond would not yield (see next_event).
    return math.max(ms, 1) / 1000
end

local function idle_for(pump)
    if pump.calls > 0 or not pump.idle_timeout then
        return nil
    end
    return (ngx.now() - pump.active) * 1000 >= pump.idle_timeout
end

-- Sends what the shim has for the socket until the socket fails or the
-- connection is closed or idle; returns why it stopped.
local function pump_writer(pump, sock)
    local len = ffi_new("size_t[1]")
    while not pump.broken and pump_serves(pump) do
        local ptr = C.grpc_wasm_wire_output(pump.id, len)
        if ptr ~= nil and len[0] > 0 then
            pump.active = ngx.now()
            local ok, err = sock:send(ffi_string(ptr, len[0]))
            if not ok then
                return err
            end
        elseif C.grpc_wasm_wire_pending(pump.id) == 2 then
            return "the server ended the HTTP/2 connection"
        elseif idle_for(pump) then
            return IDLE
        else
            local wait = pump_tick(pump)
            -- A PING to send, or the connection ended: look again at once.
            if C.grpc_wasm_wire_pending(pump.id) == 0 then
                -- Woken by calls and the reader. The shim's own deadline
                -- cancels also wake the call's waiter, whose close wakes
                -- this; the timeout is the keepalive's next tick at most.
                pump.wake:wait(wait)
            end
        end
    end
    return pump.broken or "the connection is closed"
end

local function run_pump(premature, pump)
    if premature then
        return
    end
    while pump_serves(pump) do
        local sock = ngx.socket.tcp()
        -- No read timeout to speak of: a connection without traffic is
        -- normal (no call, or a quiet stream), and nginx logs every timed
        -- out cosocket read at error level. Idle connections are closed by
        -- idle_timeout instead, without a word.
        sock:settimeouts(pump.handshake_timeout, 10000, MAX_TIMEOUT)
        local ok, err = sock:connect(pump.host, pump.port)
        if not ok then
            if not pump_reset(pump, "connect to " .. pump.addr .. " failed: " .. tostring(err)) then
                return
            end
            -- Dial again when a call wants the connection.
            pump.wake:wait(1)
        else
            pump.broken = nil
            pump.active = ngx.now()
            local reading = ngx.thread.spawn(pump_reader, pump, sock)
            local why = pump_writer(pump, sock)
            ngx.thread.kill(reading)
            sock:close()
            if pump.closed then
                return
            end
            if why == IDLE then
                -- No call to fail; a fresh HTTP/2 state waits for the next.
                if not pump_reset(pump, "the connection was idle") then
                    return
                end
                while pump.calls == 0 and not pump.closed and not ngx.worker.exiting() do
                    pump.wake:wait(1)
                end
            elseif not pump_reset(pump, "the connection failed: " .. tostring(why)) then
                return
            else
                -- A server that failed us (a handshake or a PING without an
                -- answer, a closed connection) is dialled again for the
                -- next call, not in a loop meanwhile.
                while pump.calls == 0 and not pump.closed and not ngx.worker.exiting() do
                    pump.wake:wait(1)
                end
            end
        end
    end
end

local function wake_pump(pump)
    if pump and C.grpc_wasm_wire_pending(pump.id) > 0 then
        pump.wake:post(1)
    end
end

-- cosocket unless told otherwise: a call then costs no thread hop.
local function transport_of(opts)
    local transport = opts.transport or settings.transport or os.getenv("GRPC_WASM_TRANSPORT")
    if transport == nil or transport == "" then
        return "cosocket"
    end
    return transport
end

-- A connection's keepalive interval and timeout and handshake timeout
-- (ms): from connect's opts, else grpc.init's, else 0 (the shim's default).
local function keepalive_of(opts)
    local function ms(key)
        return opts[key] or settings[key] or 0
    end
    return ms("keepalive_interval"), ms("keepalive_timeout"), ms("handshake_timeout")
end

function ffi_backend.connect(addr, opts)
    local transport = transport_of(opts)
    local interval, ka_timeout, handshake = keepalive_of(opts)
    if transport == "runtime" then
        local id = C.grpc_wasm_connect(addr, opts.host, opts.ca, opts.cert, opts.priv_key,
                                       interval, ka_timeout, handshake)
        if id < 0 then
            return nil, last_error()
        end
        return id
    end
    if transport ~= "cosocket" then
        return nil, "unknown transport '" .. tostring(transport) .. "' (runtime or cosocket)"
    end
    local host, port = addr:match("^(.+):(%d+)$")
    if not host then
        return nil, "invalid address '" .. addr .. "': expected host:port"
    end
    local id = C.grpc_wasm_wire_connect(addr, opts.host, opts.ca, opts.cert, opts.priv_key,
                                        interval, ka_timeout, handshake)
    if id < 0 then
        return nil, last_error()
    end
    local pump = { id = id, addr = addr, host = host, port = tonumber(port),
                   wake = semaphore.new(), ids = ffi_new("uint32_t[256]"),
                   calls = 0, active = ngx.now(), idle_timeout = settings.idle_timeout,
                   handshake_timeout = handshake > 0 and handshake or DEFAULT_HANDSHAKE_TIMEOUT }
    local ok, err = ngx.timer.at(0, run_pump, pump)
    if not ok then
        C.grpc_wasm_conn_close(id)
        return nil, "cannot start the connection's timer: " .. tostring(err)
    end
    pumps[id] = pump
    return id
end

function ffi_backend.conn_close(id)
    local pump = pumps[id]
    pumps[id] = nil
    C.grpc_wasm_conn_close(id)
    if pump then
        pump.closed = true
        pump.wake:post(1)
    end
end

-- key\0value\0 pairs
local function flatten(metadata)
    if not metadata then
        return nil, 0
    end
    local parts = {}
    for k, v in pairs(metadata) do
        parts[#parts + 1] = k
        parts[#parts + 1] = v
    end
    local flat = concat(parts, "\0") .. "\0"
    return flat, #flat
end

function ffi_backend.start(conn, path, body, timeout, metadata, json)
    local md, md_len = flatten(metadata)
    local id = C.grpc_wasm_start(conn, path, #path, body, body and #body or 0, timeout, md, md_len, json)
    if id < 0 then
        return nil, last_error()
    end
    local pump = pumps[conn]
    if pump then
        call_pumps[id] = pump
        pump.calls = pump.calls + 1
        wake_pump(pump)
    end
    return id
end

function ffi_backend.send(id, body)
    local rc = C.grpc_wasm_send(id, body, #body)
    wake_pump(call_pumps[id])
    return status(rc)
end

function ffi_backend.close_send(id)
    local rc = C.grpc_wasm_close_send(id)
    wake_pump(call_pumps[id])
    return status(rc)
end

-- "message", json | "end", body, http status, raw headers, code | nil, err
function ffi_backend.next_event(id, timeout_ms)
    local deadline = ngx.now() + timeout_ms / 1000 + 1
    while true do
        local n = C.grpc_wasm_next_event(id, event)
        if n < 0 then
            return nil, last_error()
        end
        if n == 1 then
            local ev = event[0]
            if ev.resumed ~= 0 then
                -- Its stream is read again: the server gets window.
                wake_pump(call_pumps[id])
            end
            local body = ffi_string(ev.body, ev.body_len)
            if ev.kind == 1 then
                return "message", body
            end
            return "end", body, ev.http_status, ffi_string(ev.headers, ev.headers_len), ev.code
        end
        local sema = waiters[id]
        if not sema then
            if n_spare > 0 then
                sema = spare_semas[n_spare]
                spare_semas[n_spare] = nil
                n_spare = n_spare - 1
            else
                sema = semaphore.new()
            end
            waiters[id] = sema
        end
        -- The module ends every call by its deadline; this wait is only a
        -- safety net against a lost wake-up. The semaphore counts whole
        -- milliseconds: asked to wait less than one, it returns at once
        -- without yielding, so the cached clock never moves and the loop
        -- would spin for good; the last fraction counts as expired.
        local left = deadline - ngx.now()
        if left < 0.001 then
            return nil, "timeout waiting for the call's end"
        end
        -- An exiting worker's reader stops once no call waits (it would
        -- hold the worker), so a wait that starts after that looks for
        -- its events every 50 ms.
        if ngx.worker.exiting() then
            left = math.min(left, 0.05)
        end
        local ok, err = sema:wait(left)
        if not ok and err ~= "timeout" then
            return nil, err
        end
    end
end

-- `ended`: the call's end was read, so closing it sends nothing.
function ffi_backend.close(id, ended)
    local sema = waiters[id]
    if sema then
        waiters[id] = nil
        -- Kept for reuse only when nothing is posted and nobody waits: a
        -- stale post would wake the next call that takes it (harmless, it
        -- looks again, but wasted).
        if sema:count() == 0 and n_spare < 1024 then
            n_spare = n_spare + 1
            spare_semas[n_spare] = sema
        end
    end
    C.grpc_wasm_close(id)
    local pump = call_pumps[id]
    if pump then
        call_pumps[id] = nil
        pump.calls = pump.calls - 1
        if not ended then
            wake_pump(pump)
        end
    end
end

-- Path (a): lua-resty-ffi's runtime; each operation is a task (JSON) that
-- the shim's own thread answers; `next` is answered when the event comes.
local resty_backend = {}
local runtime
-- Closes asked for by the garbage collector, which cannot yield for a task.
local collected = {}

local function task(request)
    while #collected > 0 do
        local req = table.remove(collected)
        runtime:call(cjson.encode(req))
    end
    local ok, res, err = runtime:call(cjson.encode(request))
    if not ok then
        return nil, err or ("grpc-wasm runtime error " .. tostring(res))
    end
    return res or ""
end

-- What the shim said when its libffi_init failed: lua-resty-ffi passes on
-- only the return code. The shim keeps the text for this (the worker's)
-- thread, which is the one that ran libffi_init.
local function init_error(shim)
    local ok, lib = pcall(ffi.load, shim)
    if not ok then
        return nil
    end
    local text = ffi_string(lib.grpc_wasm_last_error())
    return text ~= "" and text or nil
end

function resty_backend.init()
    -- lua-resty-ffi defines ngx.load_ffi in its `require "resty_ffi"`.
    if type(ngx.load_ffi) ~= "function" then
        return nil, "mode 'resty_ffi' needs lua-resty-ffi: ngx.load_ffi is not defined; "
            .. "run require \"resty_ffi\" first (e.g. in init_by_lua_block), with libresty_ffi.so "
            .. "where LuaJIT's ffi.load finds it"
    end
    local shim, err = find_shim()
    if not shim then
        return nil, err
    end
    local module, merr = find_module(shim)
    if not module then
        return nil, merr
    end
    local cfg = cjson.encode({ module = module, cache_dir = cache_dir(),
                               max_queued_bytes = settings.max_queued_bytes })
    -- ngx.load_ffi raises when the library cannot be loaded (ffi.load).
    local ok, rt, rc = pcall(ngx.load_ffi, shim, cfg)
    if not ok then
        return nil, "ngx.load_ffi cannot load " .. shim .. ": " .. tostring(rt)
    end
    if not rt then
        return nil, "ngx.load_ffi(" .. shim .. ") failed (libffi_init returned " .. tostring(rc) .. "): "
            .. (init_error(shim) or "see the error log")
    end
    runtime = rt
    return true
end

function resty_backend.loadfile(path, include)
    return task({ op = "loadfile", path = path, include = include })
end

function resty_backend.load_descriptor_set(bytes)
    return task({ op = "descriptor_set", base64 = ngx.encode_base64(bytes) })
end

function resty_backend.set_json_options(json)
    return task({ op = "json_options", options = cjson.decode(json) })
end

function resty_backend.connect(addr, opts)
    local interval, ka_timeout, handshake = keepalive_of(opts)
    local id, err = task({ op = "connect", addr = addr, host = opts.host, ca = opts.ca,
                           cert = opts.cert, priv_key = opts.priv_key, keepalive_interval = interval,
                           keepalive_timeout = ka_timeout, handshake_timeout = handshake })
    return tonumber(id), err
end

function resty_backend.conn_close(id)
    task({ op = "conn_close", conn = id })
end

function resty_backend.start(conn, path, body, timeout, metadata, json)
    local id, err = task({ op = "start", conn = conn, path = path, body = body, timeout = timeout,
                           metadata = metadata, json = json })
    return tonumber(id), err
end

function resty_backend.send(id, body)
    return task({ op = "send", id = id, body = body })
end

function resty_backend.close_send(id)
    return task({ op = "close_send", id = id })
end

-- The wait ends by the call's deadline (and a second of slack), as on the
-- FFI path, even if the event never comes.
function resty_backend.next_event(id, timeout_ms)
    local data, err = task({ op = "next", id = id, timeout = timeout_ms + 1000 })
    if not data then
        return nil, err
    end
    if data:sub(1, 2) == "M\n" then
        return "message", data:sub(3)
    end
    local http_status, hlen, at = data:match("^E (%d+) (%d+)\n()")
    if not http_status then
        return nil, "malformed event from the runtime"
    end
    hlen = tonumber(hlen)
    return "end", data:sub(at + hlen), tonumber(http_status), data:sub(at, at + hlen - 1)
end

function resty_backend.close(id)
    task({ op = "close", id = id })
end

function resty_backend.collect_conn(id)
    collected[#collected + 1] = { op = "conn_close", conn = id }
end

function resty_backend.collect_call(id)
    collected[#collected + 1] = { op = "close", id = id }
end

ffi_backend.collect_conn = ffi_backend.conn_close
ffi_backend.collect_call = ffi_backend.close

local backend
local initialised
local function ready()
    if initialised == ngx.worker.pid() then
        return true
    end
    if ngx.get_phase() == "init" then
        return nil, "grpc-wasm is not set up in init_by_lua: that is the master process, whose"
            .. " threads and sockets every worker would share; use init_worker_by_lua, or let"
            .. " the first call set the worker up"
    end
    -- LuaJIT's FFI whenever nobody asks otherwise, lua-resty-ffi or not:
    -- over cosockets a call never leaves nginx's thread, while each
    -- lua-resty-ffi task is a hop to the shim's thread and back (about
    -- 1.5-2x a native client against about 1x, in make bench-lua).
    local mode = settings.mode or getenv("GRPC_WASM_MODE") or "ffi"
    if mode ~= "ffi" and mode ~= "resty_ffi" then
        return nil, "unknown mode '" .. tostring(mode) .. "' (ffi or resty_ffi)"
    end
    local chosen = mode == "resty_ffi" and resty_backend or ffi_backend
    local ok, err = chosen.init()
    if not ok then
        return nil, err
    end
    backend = chosen
    _M.mode = mode
    initialised = ngx.worker.pid()
    return true
end

-- The phases where a call can wait: cosockets and semaphores need a
-- phase that can yield. Elsewhere (init_worker, set, header_filter,
-- body_filter, log, balancer) a call could only block the worker.
local YIELDING = {
    rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
    ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true,
}

local function check_phase(what)
    local phase = ngx.get_phase()
    if YIELDING[phase] then
        return true
    end
    return nil, what .. " cannot run in the " .. phase .. " phase, which cannot yield;"
        .. " call from rewrite, access, content or a timer (ngx.timer.at)"
end

-- A deadline in ms: a positive number, or nil for the default.
local function check_timeout(timeout, name)
    if timeout ~= nil and (type(timeout) ~= "number" or timeout ~= timeout or timeout <= 0) then
        return nil, (name or "timeout") .. " must be a positive number of milliseconds, got " .. type(timeout)
            .. (type(timeout) == "number" and " " .. tostring(timeout) or "")
    end
    return true
end

-- The keepalive options, in connect's opts or grpc.init's settings.
local KEEPALIVE_KEYS = { "keepalive_interval", "keepalive_timeout", "handshake_timeout" }

local function check_keepalive(opts)
    for _, key in ipairs(KEEPALIVE_KEYS) do
        local ok, err = check_timeout(opts[key], key)
        if not ok then
            return nil, err
        end
    end
    return true
end

-- Options must be a table (or nil): misuse is an error the caller gets
-- back, never a Lua error raised in its request.
local function check_opts(opts, what)
    if opts ~= nil and type(opts) ~= "table" then
        return nil, what .. " options must be a table, got " .. type(opts)
    end
    return true
end

--- Sets where things are before first use: shim (path of liblua_shim.so),
-- module (path of grpc_wasm.wasm), cache_dir (compiled module cache;
-- default $XDG_CACHE_HOME/grpc-wasm, ~/.cache/grpc-wasm or
-- <tmp>/grpc-wasm-<uid>; false disables it), socket_dir (where the private
-- directory of the wake-up socket is made; default the temp dir), timeout (default deadline, ms), mode
-- ("ffi", the default, or "resty_ffi"; also GRPC_WASM_MODE), idle_timeout
-- (ms: a cosocket connection without calls or traffic that long is closed,
-- and dialled again by the next call; default never), keepalive_interval,
-- keepalive_timeout, handshake_timeout (defaults for connect, below),
-- max_queued_bytes (the response bytes, as JSON, a call holds for its
-- caller before its stream is no longer read: the server is then held by
-- HTTP/2 flow control; default 4 MiB).
-- In init_by_lua (the master) it only records them: each worker sets
-- itself up at its first use.
function _M.init(opts)
    local ok, err = check_opts(opts, "init")
    if not ok then
        return false, err
    end
    ok, err = check_timeout(opts and opts.timeout)
    if not ok then
        return false, err
    end
    ok, err = check_timeout(opts and opts.idle_timeout, "idle_timeout")
    if not ok then
        return false, err
    end
    ok, err = check_keepalive(opts or {})
    if not ok then
        return false, err
    end
    local cap = opts and opts.max_queued_bytes
    if cap ~= nil and (type(cap) ~= "number" or cap ~= cap or cap < 1) then
        return false, "max_queued_bytes must be a number of bytes (1 or more), got " .. type(cap)
            .. (type(cap) == "number" and " " .. tostring(cap) or "")
    end
    for k, v in pairs(opts or {}) do
        settings[k] = v
    end
    if settings.timeout then
        DEFAULT_TIMEOUT = settings.timeout
    end
    if ngx.get_phase() == "init" then
        return true
    end
    local rok, rerr = ready()
    if not rok then
        return false, rerr
    end
    return true
end

--- Reads a whole file; returns its content, or false and an error (false,
-- not nil: `connect(addr, {ca = grpc.readfile(path)})` then fails at
-- connect instead of dropping the option, which would mean plaintext).
function _M.readfile(path)
    if type(path) ~= "string" then
        return false, "the path must be a string"
    end
    local f, err = io.open(path, "rb")
    if not f then
        return false, err
    end
    local data = f:read("*a")
    f:close()
    return data
end

--- Loads a .proto file and what it imports (searched in the file's own
-- directory, then in opts.include, a list of directories).
function _M.loadfile(path, opts)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    if type(path) ~= "string" then
        return false, "the path must be a string"
    end
    local cok, cerr = check_opts(opts, "loadfile")
    if not cok then
        return false, cerr
    end
    local include = opts and opts.include
    if include ~= nil then
        if type(include) ~= "table" then
            return false, "include must be a list of directories, got " .. type(include)
        end
        for _, dir in ipairs(include) do
            if type(dir) ~= "string" then
                return false, "include must be a list of directories, got a " .. type(dir) .. " in it"
            end
        end
    end
    local lok, lerr = backend.loadfile(path, include)
    if not lok then
        return false, lerr
    end
    return true
end

--- Loads a serialized FileDescriptorSet (protoc --include_imports -o).
function _M.load_descriptor_set(bytes)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    if type(bytes) ~= "string" then
        return false, "the descriptor set must be a string"
    end
    local lok, lerr = backend.load_descriptor_set(bytes)
    if not lok then
        return false, lerr
    end
    return true
end

--- JSON mapping of responses: emit_defaults, int64_as_number,
-- enums_as_numbers, proto_field_names (booleans).
function _M.set_json_options(opts)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    local cok, cerr = check_opts(opts, "JSON")
    if not cok then
        return false, cerr
    end
    local json = cjson.encode(opts or {})
    local sok, serr = backend.set_json_options(json)
    if not sok then
        return false, serr
    end
    return true
end

local Conn = {}
Conn.__index = Conn
local Stream = {}
Stream.__index = Stream

-- A TLS option that is present must be usable text: anything else (false
-- from a failed grpc.readfile, a number) is an error, never plaintext.
local function check_connect_opts(opts)
    local ok, err = check_opts(opts, "connect")
    if not ok or opts == nil then
        return ok, err
    end
    for _, key in ipairs({ "host", "ca", "cert", "priv_key" }) do
        local v = opts[key]
        if v ~= nil and (type(v) ~= "string" or v == "") then
            return nil, "invalid TLS options: " .. key .. " must be a non-empty string, got "
                .. (type(v) == "string" and "an empty string" or type(v))
                .. (v == false and " (did grpc.readfile fail?)" or "")
        end
    end
    if opts.transport ~= nil and type(opts.transport) ~= "string" then
        return nil, "transport must be a string, got " .. type(opts.transport)
    end
    return check_keepalive(opts)
end

--- Connects (lazily: the first call dials; the connection is shared by all
-- calls and comes back by itself after the server does). opts: host (TLS
-- server name), ca, cert, priv_key (PEM contents), transport, and in ms:
-- keepalive_interval (a PING after that long without a word from the
-- server while calls run; default 30000), keepalive_timeout (the PING's
-- answer must come within it; default 10000), handshake_timeout (the
-- server must answer the HTTP/2 handshake within it, TLS included;
-- default 10000). A connection that misses either answer ends, its calls
-- fail UNAVAILABLE, and the next call dials again.
function _M.connect(addr, opts)
    local pok, perr = check_phase("grpc.connect")
    if not pok then
        return false, perr
    end
    local ok, err = ready()
    if not ok then
        return false, err
    end
    if type(addr) ~= "string" then
        return false, "the address must be a string like '127.0.0.1:50051'"
    end
    local vok, verr = check_connect_opts(opts)
    if not vok then
        return false, verr
    end
    opts = opts or {}
    local id, cerr = backend.connect(addr, opts)
    if not id then
        return false, cerr
    end
    -- Closed when collected, if the caller never closes it.
    local collect = backend.collect_conn
    local handle = ffi_gc(ffi_new("uint32_t[1]", id), function(h) collect(h[0]) end)
    return true, setmetatable({ id = id, handle = handle }, Conn)
end

function Conn:close()
    if self.closed then
        return true
    end
    self.closed = true
    backend.conn_close(self.id)
    ffi_gc(self.handle, nil)
    return true
end

local function encode(message)
    if type(message) == "string" then
        return message
    end
    if message == nil then
        return "{}"
    end
    if type(message) ~= "table" then
        return nil, "the message must be a table or a JSON string, got " .. type(message)
    end
    local json, err = cjson.encode(message)
    if not json then
        return nil, "cannot encode the message as JSON: " .. err
    end
    return json
end

-- Metadata as gRPC allows it: keys of lowercase letters, digits, '-', '_'
-- and '.'; ASCII values without control characters (NUL, CR and LF above
-- all: the native side separates entries with NUL, HTTP/2 lines end with
-- CRLF, so either would let a value smuggle in entries of its own).
-- -bin values may hold any bytes and go as base64, as gRPC carries them.
local function encode_metadata(metadata)
    if metadata == nil then
        return nil
    end
    if type(metadata) ~= "table" then
        return nil, "metadata must be a table, got " .. type(metadata)
    end
    local out = {}
    for k, v in pairs(metadata) do
        if type(k) ~= "string" then
            return nil, "metadata keys must be strings, got " .. type(k)
        end
        k = k:lower()
        if not k:find("^[0-9a-z_.%-]+$") then
            return nil, "invalid metadata key '" .. k:gsub("%c", "?") .. "': only letters, digits, '-', '_' and '.'"
        end
        local tv = type(v)
        if tv ~= "string" and tv ~= "number" then
            return nil, "metadata value of '" .. k .. "' must be a string, got " .. tv
        end
        v = tostring(v)
        if k:sub(-4) == "-bin" then
            v = ngx.encode_base64(v)
        elseif v:find("%c") then
            return nil, "metadata value of '" .. k .. "' holds a control character (NUL, CR, LF...); "
                .. "binary values need a key ending in -bin"
        end
        out[k] = v
    end
    return out
end

-- key\0value\0 pairs: grpc-metadata-* are headers, grpc-trailer-* trailers.
local function parse_headers(raw)
    local headers, trailers, list = {}, {}, {}
    local find, sub = string.find, string.sub
    local at = 1
    while true do
        local k_end = find(raw, "\0", at, true)
        if not k_end then
            break
        end
        local v_end = find(raw, "\0", k_end + 1, true)
        if not v_end then
            break
        end
        local k, v = sub(raw, at, k_end - 1), sub(raw, k_end + 1, v_end - 1)
        list[k] = v
        if sub(k, 1, 14) == "grpc-metadata-" then
            headers[sub(k, 15)] = v
        elseif sub(k, 1, 13) == "grpc-trailer-" then
            trailers[sub(k, 14)] = v
        end
        at = v_end + 1
    end
    return headers, trailers, list
end

-- A call's end: code, http_status and body at once; name, headers and
-- trailers when first read (most successful calls never read them).
local Info = {}
Info.__index = function(info, key)
    if key ~= "headers" and key ~= "trailers" and key ~= "name" then
        return nil
    end
    local headers, trailers, list = parse_headers(rawget(info, "raw") or "")
    rawset(info, "headers", headers)
    rawset(info, "trailers", trailers)
    if rawget(info, "name") == nil then
        rawset(info, "name", list["grpc-status-name"] or "UNKNOWN")
    end
    return rawget(info, key)
end

-- The grpc-status entry of raw headers (a key starts the text or follows a NUL).
local function status_code(raw)
    local _, _, code = ("\0" .. (raw or "")):find("%zgrpc%-status%z(%d+)%z")
    return tonumber(code) or 2
end

-- The next event of a call: "message", json | "end", info | nil, err.
local function wait_event(id, timeout_ms)
    local kind, body, http_status, raw, code = backend.next_event(id, timeout_ms)
    if kind ~= "end" then
        return kind, body
    end
    if not code or code < 0 then
        code = status_code(raw)
    end
    return "end", setmetatable({ code = code, http_status = http_status, body = body, raw = raw }, Info)
end

local function failure(info)
    local decoded = cjson.decode(info.body) or {}
    info.message = decoded.message or info.body
    info.details = decoded.details
    return false, info.name .. " (" .. info.code .. "): " .. tostring(info.message), info
end

-- A call that failed on this side (no status came): false, err, info as
-- for any failed call, INTERNAL.
local function local_failure(message)
    return failure(setmetatable({ code = 13, name = "INTERNAL", http_status = 0, raw = "",
                                  body = cjson.encode({ code = 13, message = message }) }, Info))
end

local function decode_message(json)
    local message, err = cjson.decode(json)
    if message == nil then
        return nil, "cannot decode a response message as JSON: " .. tostring(err)
    end
    return message
end

local function start(conn, path, body, opts)
    if conn.closed then
        return nil, "the connection is closed"
    end
    if type(path) ~= "string" then
        return nil, "the method path must be a string like '/pkg.Service/Method'"
    end
    local ook, oerr = check_opts(opts, "call")
    if not ook then
        return nil, oerr
    end
    local tok, terr = check_timeout(opts and opts.timeout)
    if not tok then
        return nil, terr
    end
    local timeout = opts and opts.timeout or DEFAULT_TIMEOUT
    local json
    if opts and opts.json ~= nil and type(opts.json) ~= "table" then
        return nil, "json options must be a table, got " .. type(opts.json)
    end
    if opts and opts.json then
        local names = {}
        for name, on in pairs(opts.json) do
            if on then
                names[#names + 1] = name
            end
        end
        json = concat(names, ",")
    end
    local metadata, merr = encode_metadata(opts and opts.metadata)
    if merr then
        return nil, merr
    end
    local id, err = backend.start(conn.id, path, body, timeout, metadata, json)
    if not id then
        return nil, err
    end
    return id, timeout
end

local function forget(id, ended)
    backend.close(id, ended)
end

--- A unary call: ok, response table | false, err, info. info has code,
-- name, message, details, http_status, headers and trailers.
-- opts: timeout (ms), metadata (table), raw (true: the response as JSON text).
function Conn:unary(path, message, opts)
    local pok, perr = check_phase("conn:unary")
    if not pok then
        return false, perr
    end
    local body, err = encode(message)
    if not body then
        return false, err
    end
    local id, timeout = start(self, path, body, opts)
    if not id then
        return false, timeout
    end
    local messages
    while true do
        local kind, data = wait_event(id, timeout)
        if not kind then
            forget(id)
            return local_failure(data)
        end
        if kind == "message" then
            local reply, derr = decode_message(data)
            if not reply then
                forget(id)
                return local_failure(derr)
            end
            messages = messages or {}
            messages[#messages + 1] = reply
        else
            forget(id, true)
            if data.code ~= 0 then
                return failure(data)
            end
            if messages then
                return true, messages, data
            end
            if opts and opts.raw then
                return true, data.body, data
            end
            local res, derr = cjson.decode(data.body)
            if res == nil then
                return false, "cannot decode the response JSON: " .. tostring(derr), data
            end
            return true, res, data
        end
    end
end

--- A stream for any streaming kind: send / close_send / recv / close.
function Conn:new_stream(path, opts)
    local pok, perr = check_phase("conn:new_stream")
    if not pok then
        return false, perr
    end
    local id, timeout = start(self, path, nil, opts)
    if not id then
        return false, timeout
    end
    local collect = backend.collect_call
    local handle = ffi_gc(ffi_new("uint32_t[1]", id), function(h) collect(h[0]) end)
    -- The stream holds its conn, so that a conn nobody else references is
    -- not collected (and closed) while the stream still uses it.
    return true, setmetatable({ id = id, timeout = timeout, handle = handle, conn = self }, Stream)
end

function Stream:send(message)
    local pok, perr = check_phase("stream:send")
    if not pok then
        return false, perr
    end
    if self.closed or self.finished then
        return false, "the stream is closed"
    end
    local body, err = encode(message)
    if not body then
        return false, err
    end
    local sok, serr = backend.send(self.id, body)
    if not sok then
        return false, serr
    end
    return true
end

function Stream:close_send()
    local pok, perr = check_phase("stream:close_send")
    if not pok then
        return false, perr
    end
    if self.closed or self.finished then
        return false, "the stream is closed"
    end
    local cok, cerr = backend.close_send(self.id)
    if not cok then
        return false, cerr
    end
    return true
end

-- Ends a stream with a failure that every later recv repeats.
local function stream_failed(stream, ok, err, info)
    stream.finished = true
    stream.failure = { err, info }
    stream.info = info
    return ok, err, info
end

--- ok, message | ok, nil at the end | false, err, info (again on every
-- later recv once the stream has failed).
function Stream:recv()
    local pok, perr = check_phase("stream:recv")
    if not pok then
        return false, perr
    end
    if self.closed then
        return false, "the stream is closed"
    end
    if self.failure then
        return false, self.failure[1], self.failure[2]
    end
    if self.finished then
        return true, nil
    end
    local kind, data = wait_event(self.id, self.timeout)
    if kind == "message" then
        local message, derr = decode_message(data)
        if message then
            return true, message
        end
        data = derr
        kind = nil
    end
    if not kind then
        -- The call may still run: it ends here, as the caller was told.
        self.forgotten = true
        forget(self.id)
        return stream_failed(self, local_failure(data))
    end
    self.finished = true
    self.info = data
    if data.code ~= 0 then
        return stream_failed(self, failure(data))
    end
    return true, nil
end

function Stream:close()
    if not self.closed then
        self.closed = true
        if not self.forgotten then
            forget(self.id)
        end
        ffi_gc(self.handle, nil)
    end
    return true
end

return _M

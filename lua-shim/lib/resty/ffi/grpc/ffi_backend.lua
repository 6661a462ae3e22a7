-- resty.ffi.grpc.ffi_backend: the backend over LuaJIT's FFI (mode "ffi",
-- the default). Calls go straight into liblua_shim.so; a coroutine waits
-- on a semaphore that a light thread reading the shim's wake-up socket
-- posts. A connection's bytes go through a cosocket of its own (transport
-- "cosocket", the default: HTTP/2 runs in the shim on nginx's thread) or
-- through the shim's runtime thread (transport "runtime"). The interface
-- it implements is written in resty.ffi.grpc.
local ffi = require("ffi")
local semaphore = require("ngx.semaphore")
local native = require("resty.ffi.grpc.shim")

local ngx = ngx
local tostring, tonumber = tostring, tonumber
local concat = table.concat
local ffi_string, ffi_new = ffi.string, ffi.new
local settings, find_shim, find_module = native.settings, native.find_shim, native.find_module
local cache_dir, keepalive_of = native.cache_dir, native.keepalive_of
local flatten_pairs = native.flatten_pairs

local C
-- The shim's defaults (ms), for the cosocket's own connect timeout.
local DEFAULT_HANDSHAKE_TIMEOUT = 10000
local waiters = {} -- call id -> semaphore
-- Semaphores of finished calls, for the next ones: a call then allocates none.
local spare_semas, n_spare = {}, 0
local event = ffi_new("grpc_wasm_event[1]")
local ready_ids = ffi_new("uint32_t[256]")

local function last_error()
    return ffi_string(C.grpc_wasm_last_error())
end

-- A call's semaphore, once nothing will wait on it again (its end was read,
-- or it closed): an exiting worker's reader runs while any is held.
local function release_waiter(id)
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
end

-- Once the worker exits, one full collection closes the calls no one holds
-- any more (their finalizers), so that they hold neither a connection nor
-- the wake-up reader, and the worker can end.
local swept = false
local function sweep_once()
    if not swept then
        swept = true
        collectgarbage()
    end
end

-- Whether the wake-up reader goes on: always, and once the worker exits,
-- while calls wait.
local function reader_serves()
    if not ngx.worker.exiting() then
        return true
    end
    sweep_once()
    return next(waiters) ~= nil
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
    while ok and reader_serves() do
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
    -- A shim of another release (or one from before it said) is refused.
    local vok, version = pcall(function() return ffi_string(lib.grpc_wasm_version()) end)
    version = vok and version or "from before 0.1.0"
    if version ~= native.VERSION then
        return nil, "resty.ffi.grpc is " .. native.VERSION .. ", and " .. shim .. " is " .. version
            .. ": install both from the same release"
    end
    local older = native.older_build(lib, shim)
    if older then
        return nil, older
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

function ffi_backend.metrics()
    local len = ffi_new("size_t[1]")
    local text = C.grpc_wasm_metrics(len)
    if text == nil then
        return nil, last_error()
    end
    return ffi_string(text, len[0])
end

-- Cosocket connections: HTTP/2 and TLS run in the shim, on this thread;
-- a timer per connection owns its socket and moves the bytes (one light
-- thread reads, one writes). A call then never leaves nginx's thread.
local pumps = {} -- conn id -> pump
local call_pumps = {} -- call id -> pump

-- The longest timeout a cosocket takes (lua-nginx-module refuses more
-- than 2^31-1 ms): about 24 days.
local MAX_TIMEOUT = 2147483647

-- Ends every call of the conn with `reason` and gives it a fresh HTTP/2
-- state. The callers close those calls later, when their threads run, so
-- the pump counts what wants the connection from here on: a call started
-- after the reset (`wanted`). Counting open calls made it dial again for
-- calls that had already failed.
local function pump_reset(pump, reason)
    local n = C.grpc_wasm_wire_reset(pump.id, reason, pump.ids, 256)
    pump.wanted = false
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
            local pending = C.grpc_wasm_wire_pending(pump.id)
            if pending ~= 0 then
                pump.wake:post(1)
            end
            -- Over: nothing takes what the server still sends, and a
            -- reader that read on grew the worker by the server's rate
            -- while the writer waited on a server that reads nothing.
            if pending == 2 then
                return
            end
        end
    end
end

local IDLE = {} -- pump_writer's answer for a connection idle too long

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
    sweep_once()
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
        else
            local pending = C.grpc_wasm_wire_pending(pump.id)
            if pending == 2 then
                return "the server ended the HTTP/2 connection"
            elseif pending < 0 then
                -- Gone from the shim (a panic closed every connection): no
                -- tick would wait, and the loop would spin the worker.
                return last_error()
            elseif idle_for(pump) then
                return IDLE
            end
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

-- Until a call wants the connection. While the worker exits the pump
-- ends once its calls are closed (pump_serves), so it stops waiting then;
-- until then it waits too: failed calls their callers still hold must not
-- make it dial again, and a connect that fails without yielding would
-- spin the worker.
local function wait_for_a_call(pump)
    while not pump.wanted and not pump.closed do
        if not ngx.worker.exiting() then
            pump.wake:wait(1)
        elseif pump.calls == 0 then
            return
        else
            pump.wake:wait(0.05)
        end
    end
end

-- One connection's life: dial, serve until it ends, and mend what it
-- leaves. Returns whether the pump goes on.
local function pump_connection(pump)
    local sock = ngx.socket.tcp()
    -- No read timeout to speak of: a connection without traffic is
    -- normal (no call, or a quiet stream), and nginx logs every timed
    -- out cosocket read at error level. Idle connections are closed by
    -- idle_timeout instead, without a word.
    sock:settimeouts(pump.handshake_timeout, 10000, MAX_TIMEOUT)
    local ok, err = sock:connect(pump.host, pump.port)
    if not ok then
        if not pump_reset(pump, "connect to " .. pump.addr .. " failed: " .. tostring(err)) then
            return false
        end
        -- Dial again when a call wants the connection; a server that is
        -- down is left alone meanwhile.
        wait_for_a_call(pump)
        return true
    end
    pump.broken = nil
    pump.active = ngx.now()
    local reading = ngx.thread.spawn(pump_reader, pump, sock)
    local why = pump_writer(pump, sock)
    ngx.thread.kill(reading)
    sock:close()
    if pump.closed then
        return false
    end
    local reason = why == IDLE and "the connection was idle" or "the connection failed: " .. tostring(why)
    if not pump_reset(pump, reason) then
        return false
    end
    -- No call to fail (idle), or a server that failed us (a handshake or
    -- a PING without an answer, a closed connection): a fresh HTTP/2
    -- state waits for the next call, and the server is dialled again
    -- then, not in a loop meanwhile.
    wait_for_a_call(pump)
    return true
end

-- Each connection runs in a timer of its own. What a cosocket allocates
-- lives in its timer's request pool until the timer ends, so one timer
-- dialling again and again (a server that restarts, connects refused)
-- grew its worker by megabytes for good. While the worker exits, a new
-- timer would start already expired: the pump stays in this one, serving
-- the calls in flight.
local run_pump

-- Hands the pump to a new timer; returns whether there is one. When there
-- is none (ngx.timer.at fails: lua_max_pending_timers reached), the pump
-- stays in this timer rather than stop.
local function hand_over(pump)
    local ok, err = ngx.timer.at(0, run_pump, pump)
    if not ok then
        ngx.log(ngx.WARN, "grpc-wasm: ", pump.addr, ": no timer for the next connection (",
                err, "); it stays in this one")
    end
    return ok
end

run_pump = function(_, pump)
    while pump_serves(pump) do
        if not pump_connection(pump) then
            return
        end
        if not ngx.worker.exiting() and pump_serves(pump) and hand_over(pump) then
            return
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

function ffi_backend.connect(addr, opts)
    local transport = transport_of(opts)
    local interval, ka_timeout, handshake = keepalive_of(opts)
    -- The strings stay referenced by addr and opts for the call.
    local options = ffi_new("grpc_wasm_connect_options", {
        addr = addr, host = opts.host, ca = opts.ca, cert = opts.cert, key = opts.priv_key,
        keepalive_ms = interval, keepalive_timeout_ms = ka_timeout, handshake_timeout_ms = handshake,
    })
    if transport == "runtime" then
        local id = C.grpc_wasm_connect(options)
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
    local id = C.grpc_wasm_wire_connect(options)
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

-- Call `id` on `conn` counts on the connection's pump (a cosocket
-- connection's), which is woken for the bytes it has to send.
local function with_pump(conn, id)
    local pump = pumps[conn]
    if pump then
        call_pumps[id] = pump
        pump.calls = pump.calls + 1
        pump.wanted = true
        wake_pump(pump)
    end
    return id
end

function ffi_backend.start(conn, path, body, timeout, metadata, propagated, json, compression)
    local md, md_len = flatten_pairs(metadata)
    local pr, pr_len = flatten_pairs(propagated)
    local id = C.grpc_wasm_start(conn, path, #path, body, body and #body or 0, timeout, md, md_len, pr, pr_len,
                                 json, compression)
    if id < 0 then
        return nil, last_error()
    end
    return with_pump(conn, id)
end

function ffi_backend.reflect(conn, services, timeout)
    local list = services and concat(services, "\n")
    local id = C.grpc_wasm_reflect(conn, list, list and #list or 0, timeout)
    if id < 0 then
        return nil, last_error()
    end
    return with_pump(conn, id)
end

local text_len = ffi_new("size_t[1]")

local function text(ptr)
    if ptr == nil then
        return nil, last_error()
    end
    return ffi_string(ptr, text_len[0])
end

function ffi_backend.reflected(id)
    return text(C.grpc_wasm_reflected(id, text_len))
end

function ffi_backend.describe(name)
    return text(C.grpc_wasm_describe(name, #name, text_len))
end

function ffi_backend.openapi(json)
    return text(C.grpc_wasm_openapi(json, #json, text_len))
end

function ffi_backend.send(id, body, compress)
    local rc = C.grpc_wasm_send(id, body, #body, compress and 1 or 0)
    wake_pump(call_pumps[id])
    return status(rc)
end

function ffi_backend.send_backlog(id)
    return tonumber(C.grpc_wasm_send_backlog(id))
end

function ffi_backend.close_send(id)
    local rc = C.grpc_wasm_close_send(id)
    wake_pump(call_pumps[id])
    return status(rc)
end

-- The call no longer counts on its connection's pump: an exiting worker's
-- pump keeps its connection while calls count. wake: the pump has bytes to
-- send for it (a cancel).
local function release_pump(id, wake)
    local pump = call_pumps[id]
    if pump then
        call_pumps[id] = nil
        pump.calls = pump.calls - 1
        if wake then
            wake_pump(pump)
        end
    end
end

-- "message", json | "end", body, http status, raw headers, code | nil, err
function ffi_backend.next_event(id, timeout_ms, slack_ms)
    local deadline = ngx.now() + (timeout_ms + (slack_ms or 1000)) / 1000
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
            -- Nothing comes after the end: a stream its caller keeps and
            -- never closes must not keep an exiting worker's reader or
            -- connection running. Its pump is woken once for what the end
            -- left to send (a deadline's RST_STREAM).
            release_waiter(id)
            release_pump(id, true)
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
    release_waiter(id)
    C.grpc_wasm_close(id)
    release_pump(id, not ended)
end

ffi_backend.collect_conn = ffi_backend.conn_close
ffi_backend.collect_call = ffi_backend.close

return ffi_backend

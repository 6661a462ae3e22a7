-- resty.ffi.grpc: a non-blocking gRPC client for OpenResty and nginx-lua.
--
-- Protobuf, JSON mapping and gRPC semantics run in the grpc-wasm module
-- (the same .wasm that Envoy loads), hosted by liblua_shim.so, which also
-- does the HTTP/2 transport. This file is glue: Lua tables go in and come
-- out as JSON (cjson), and a coroutine waits on an ngx.semaphore that a
-- per-worker cosocket reader posts when the native side has news. Two ways
-- in: lua-resty-ffi's runtime when ngx.load_ffi exists, else LuaJIT's FFI.

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
} grpc_wasm_event;

const char *grpc_wasm_last_error(void);
int grpc_wasm_init(const char *module_path, const char *cache_dir, const char *socket_dir);
const char *grpc_wasm_socket_path(void);
int grpc_wasm_ready(uint32_t *out, int max);
int grpc_wasm_loadfile(const char *path, const char *include);
int grpc_wasm_load_descriptor_set(const char *data, size_t len);
int grpc_wasm_set_print_options(const char *json, size_t len);
int grpc_wasm_connect(const char *addr, const char *host, const char *ca, const char *cert, const char *key);
void grpc_wasm_conn_close(uint32_t conn);
int grpc_wasm_start(uint32_t conn, const char *path, size_t path_len, const char *body, size_t body_len,
                    int64_t timeout_ms, const char *metadata, size_t metadata_len);
int grpc_wasm_send(uint32_t id, const char *json, size_t len);
int grpc_wasm_close_send(uint32_t id);
int grpc_wasm_next_event(uint32_t id, grpc_wasm_event *out);
void grpc_wasm_close(uint32_t id);
]]

local DEFAULT_TIMEOUT = 10000 -- ms; every call ends by its deadline
local settings = {}
local waiters = {} -- call id -> semaphore
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

local function find_shim()
    local path = settings.shim or os.getenv("GRPC_WASM_SHIM") or search(package.cpath, "liblua_shim")
    if not path then
        return nil, "liblua_shim.so not found: set GRPC_WASM_SHIM, grpc.init{shim = path} or package.cpath"
    end
    return path
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
    while ok and not ngx.worker.exiting() do
        local data, rerr = sock:receiveany(4096)
        if not data then
            ngx.log(ngx.ERR, "grpc-wasm: wake-up socket: ", rerr)
            break
        end
        while true do
            local n = C.grpc_wasm_ready(ready_ids, 256)
            for i = 0, n - 1 do
                local sema = waiters[ready_ids[i]]
                if sema then
                    sema:post(1)
                end
            end
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

local initialised
local function init_worker()
    if initialised == ngx.worker.pid() then
        return true
    end
    local shim, err = find_shim()
    if not shim then
        return nil, err
    end
    local ok, lib = pcall(ffi.load, shim)
    if not ok then
        return nil, "cannot load " .. shim .. ": " .. tostring(lib)
    end
    C = lib
    local module = settings.module or os.getenv("GRPC_WASM_MODULE") or (dirname(shim) .. "/grpc_wasm.wasm")
    local cache = settings.cache_dir or os.getenv("GRPC_WASM_CACHE_DIR") or "/tmp"
    if C.grpc_wasm_init(module, cache, settings.socket_dir or "/tmp") ~= 0 then
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
    initialised = ngx.worker.pid()
    return true
end

local function ready()
    if initialised == ngx.worker.pid() then
        return true
    end
    return init_worker()
end

--- Sets where things are before first use: shim (path of liblua_shim.so),
-- module (path of grpc_wasm.wasm), cache_dir (compiled module cache),
-- socket_dir (wake-up sockets), timeout (default deadline, ms).
function _M.init(opts)
    for k, v in pairs(opts or {}) do
        settings[k] = v
    end
    if settings.timeout then
        DEFAULT_TIMEOUT = settings.timeout
    end
    return ready()
end

--- Reads a whole file; returns its content, or nil and an error.
function _M.readfile(path)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, err
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
    local include = opts and opts.include and concat(opts.include, "\n") or nil
    if C.grpc_wasm_loadfile(path, include) ~= 0 then
        return false, last_error()
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
    if C.grpc_wasm_load_descriptor_set(bytes, #bytes) ~= 0 then
        return false, last_error()
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
    local json = cjson.encode(opts or {})
    if C.grpc_wasm_set_print_options(json, #json) ~= 0 then
        return false, last_error()
    end
    return true
end

local Conn = {}
Conn.__index = Conn
local Stream = {}
Stream.__index = Stream

--- Connects (lazily: the first call dials; the connection is shared by all
-- calls and comes back by itself after the server does). opts: host (TLS
-- server name), ca, cert, priv_key (PEM contents).
function _M.connect(addr, opts)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    if type(addr) ~= "string" then
        return false, "the address must be a string like '127.0.0.1:50051'"
    end
    opts = opts or {}
    local id = C.grpc_wasm_connect(addr, opts.host, opts.ca, opts.cert, opts.priv_key)
    if id < 0 then
        return false, last_error()
    end
    -- Closed when collected, if the caller never closes it.
    local handle = ffi_gc(ffi_new("uint32_t[1]", id), function(h) C.grpc_wasm_conn_close(h[0]) end)
    return true, setmetatable({ id = id, handle = handle }, Conn)
end

function Conn:close()
    if self.closed then
        return true
    end
    self.closed = true
    C.grpc_wasm_conn_close(self.id)
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

-- key\0value\0 pairs; -bin values go as base64, as gRPC carries them.
local function encode_metadata(metadata)
    if not metadata then
        return nil, 0
    end
    local parts = {}
    for k, v in pairs(metadata) do
        k = tostring(k):lower()
        v = tostring(v)
        if k:sub(-4) == "-bin" then
            v = ngx.encode_base64(v)
        end
        parts[#parts + 1] = k
        parts[#parts + 1] = v
    end
    local flat = concat(parts, "\0") .. "\0"
    return flat, #flat
end

local function parse_headers(ptr, len)
    local headers, trailers, list = {}, {}, {}
    if ptr == nil or len == 0 then
        return headers, trailers, list
    end
    local raw = ffi_string(ptr, len)
    for k, v in raw:gmatch("([^%z]*)%z([^%z]*)%z") do
        list[k] = v
        local m = k:match("^grpc%-metadata%-(.*)$")
        local t = k:match("^grpc%-trailer%-(.*)$")
        if m then
            headers[m] = v
        elseif t then
            trailers[t] = v
        end
    end
    return headers, trailers, list
end

-- The next event of a call: "message", json | "end", info | nil, err.
local function wait_event(id, timeout_ms)
    local deadline = ngx.now() + timeout_ms / 1000 + 1
    while true do
        local n = C.grpc_wasm_next_event(id, event)
        if n < 0 then
            return nil, last_error()
        end
        if n == 1 then
            local ev = event[0]
            local body = ffi_string(ev.body, ev.body_len)
            if ev.kind == 1 then
                return "message", body
            end
            local headers, trailers, list = parse_headers(ev.headers, ev.headers_len)
            return "end", {
                code = tonumber(list["grpc-status"]) or 2,
                name = list["grpc-status-name"] or "UNKNOWN",
                http_status = ev.http_status,
                body = body,
                headers = headers,
                trailers = trailers,
            }
        end
        local sema = waiters[id]
        if not sema then
            sema = semaphore.new()
            waiters[id] = sema
        end
        -- The module ends every call by its deadline; this wait is only a
        -- safety net against a lost wake-up.
        local left = deadline - ngx.now()
        if left <= 0 then
            return nil, "timeout waiting for the call's end"
        end
        local ok, err = sema:wait(left)
        if not ok and err ~= "timeout" then
            return nil, err
        end
    end
end

local function failure(info)
    local status = cjson.decode(info.body) or {}
    info.message = status.message or info.body
    info.details = status.details
    return false, info.name .. " (" .. info.code .. "): " .. tostring(info.message), info
end

local function start(conn, path, body, opts)
    if conn.closed then
        return nil, "the connection is closed"
    end
    if type(path) ~= "string" then
        return nil, "the method path must be a string like '/pkg.Service/Method'"
    end
    local timeout = opts and opts.timeout or DEFAULT_TIMEOUT
    local md, md_len = encode_metadata(opts and opts.metadata)
    local id = C.grpc_wasm_start(conn.id, path, #path, body, body and #body or 0, timeout, md, md_len)
    if id < 0 then
        return nil, last_error()
    end
    return id, timeout
end

local function forget(id)
    waiters[id] = nil
    C.grpc_wasm_close(id)
end

--- A unary call: ok, response table | false, err, info. info has code,
-- name, message, details, http_status, headers and trailers.
-- opts: timeout (ms), metadata (table), raw (true: the response as JSON text).
function Conn:unary(path, message, opts)
    local body, err = encode(message)
    if not body then
        return false, err
    end
    local id, timeout = start(self, path, body, opts)
    if not id then
        return false, timeout
    end
    local messages = {}
    while true do
        local kind, data = wait_event(id, timeout)
        if not kind then
            forget(id)
            return false, data
        end
        if kind == "message" then
            messages[#messages + 1] = cjson.decode(data)
        else
            forget(id)
            if data.code ~= 0 then
                return failure(data)
            end
            if #messages > 0 then
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
    local id, timeout = start(self, path, nil, opts)
    if not id then
        return false, timeout
    end
    local handle = ffi_gc(ffi_new("uint32_t[1]", id), function(h) forget(h[0]) end)
    return true, setmetatable({ id = id, timeout = timeout, handle = handle }, Stream)
end

function Stream:send(message)
    if self.closed or self.finished then
        return false, "the stream is closed"
    end
    local body, err = encode(message)
    if not body then
        return false, err
    end
    if C.grpc_wasm_send(self.id, body, #body) ~= 0 then
        return false, last_error()
    end
    return true
end

function Stream:close_send()
    if self.closed or self.finished then
        return false, "the stream is closed"
    end
    if C.grpc_wasm_close_send(self.id) ~= 0 then
        return false, last_error()
    end
    return true
end

--- ok, message | ok, nil at the end | false, err, info.
function Stream:recv()
    if self.closed then
        return false, "the stream is closed"
    end
    if self.finished then
        return true, nil
    end
    local kind, data = wait_event(self.id, self.timeout)
    if not kind then
        return false, data
    end
    if kind == "message" then
        return true, cjson.decode(data)
    end
    self.finished = true
    self.info = data
    if data.code ~= 0 then
        return failure(data)
    end
    return true, nil
end

function Stream:close()
    if not self.closed then
        self.closed = true
        forget(self.id)
        ffi_gc(self.handle, nil)
    end
    return true
end

return _M

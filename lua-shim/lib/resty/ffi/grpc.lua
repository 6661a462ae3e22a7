-- resty.ffi.grpc: a non-blocking gRPC client for OpenResty and nginx-lua.
--
-- Protobuf, JSON mapping and gRPC semantics run in the grpc-wasm module
-- (the same .wasm that Envoy loads), hosted by liblua_shim.so, which also
-- does HTTP/2 and TLS. This file is the public API and its checks: Lua
-- tables go in and come out as JSON (cjson). It reaches the shim through
-- one of two backends with the same interface (below): LuaJIT's FFI
-- (resty.ffi.grpc.ffi_backend, the default) or lua-resty-ffi's runtime
-- (resty.ffi.grpc.resty_backend, when asked for: mode = "resty_ffi").
--
-- Returns: every public function (grpc.*, conn:*, stream:*) answers
-- `true, value` or `false, err`, the seed API's `ok, res` that
-- lua-resty-ffi-grpc users already write, and raises nothing. The local
-- helpers answer as lua-resty-http's do: a value, or `nil, err`.

local ffi = require("ffi")
local cjson = require("cjson.safe")
local native = require("resty.ffi.grpc.shim")
local metrics = require("resty.ffi.grpc.metrics")

local ngx = ngx
local type, pairs, ipairs, tostring = type, pairs, ipairs, tostring
local setmetatable = setmetatable
local min = math.min
local sub = string.sub
local decode_base64 = ngx.decode_base64
local concat = table.concat
local ffi_new, ffi_gc = ffi.new, ffi.gc
local settings, getenv = native.settings, native.getenv

-- version and _VERSION: the project's (the shim's and the module's too).
local _M = { _VERSION = native.VERSION, version = native.VERSION }

local DEFAULT_TIMEOUT = 10000 -- ms; every call ends by its deadline
-- A backend is a table of functions; ids are the shim's (numbers). Each
-- answers nil, err on failure unless said otherwise.
--   init() -> true                      loads the shim, once per worker
--   loadfile(path, include) -> true     include: a list of directories
--   load_descriptor_set(bytes) -> true
--   set_json_options(json) -> true
--   connect(addr, opts) -> conn id      opts: connect's, checked
--   conn_close(conn)
--   start(conn, path, body, timeout, metadata, json, compression)
--       -> call id                      body: nil for a stream; timeout in
--                                       ms; metadata: a checked table or
--                                       nil; json: option names or nil;
--                                       compression: "gzip", "identity" or
--                                       nil (the shim checks the name)
--   send(id, body, compress) -> true    compress: false sends this message
--                                       uncompressed on a compressed call
--   send_backlog(id) -> bytes           a stream's request bytes its
--                                       transport holds past the bound; 0:
--                                       send on; -1: the call is over
--                                       (never fails)
--   close_send(id) -> true
--   next_event(id, timeout_ms, slack_ms)
--                                       the call's next event, waited for
--       -> "message", json              at most its deadline and slack_ms
--                                       (default a second: the module ends
--                                       its calls by their deadline)
--        | "end", body, http status, raw headers (key\0value\0...),
--          gRPC code (as the shim decided it)
--   reflect(conn, services, timeout)   a reflection load (services: a
--       -> call id                      list, or nil for all; timeout in
--                                       ms); its one event is its end
--   reflected(id) -> json               a finished load's set joins what
--                                       is loaded; the services, as JSON
--   describe(name) -> json              what is loaded ("" : the services)
--   openapi(options json) -> json       an OpenAPI document of what is loaded
--   close(id, ended)                    ended: its end was read
--   collect_conn(conn), collect_call(id)
--                                       close from a garbage collector's
--                                       finalizer, which cannot yield
local BACKENDS = {
    ffi = "resty.ffi.grpc.ffi_backend",
    resty_ffi = "resty.ffi.grpc.resty_backend",
}
local backend
local initialised

-- Each worker publishes its metrics in the lua_shared_dict grpc.init
-- named (metrics_dict), every metrics_interval ms, for grpc.prometheus.
local publish_failed -- logged once, until publishing works again
local function publish_metrics(premature)
    if premature or not backend then
        return
    end
    local text, err = backend.metrics()
    local ok = false
    if text then
        ok, err = metrics.publish(settings.metrics_dict, text)
    end
    if not ok and not publish_failed then
        ngx.log(ngx.ERR, "grpc-wasm: ", err)
    end
    publish_failed = not ok
end

local function start_publishing()
    if not settings.metrics_dict then
        return
    end
    local ok, err = ngx.timer.every((settings.metrics_interval or 1000) / 1000, publish_metrics)
    if not ok then
        ngx.log(ngx.ERR, "grpc-wasm: cannot publish metrics: ", err)
    end
end

-- Names of grpc.init{propagate} that metadata cannot carry (the
-- protocols' own headers, the proxy's), by the core's rule, which the shim
-- holds: nil, or why the first such name is refused.
local function refused_name(names, shim)
    for i, name in ipairs(names) do
        local why = native.check_propagated(name[1], shim)
        if why then
            return "propagate[" .. i .. "]: " .. why
        end
    end
    return nil
end

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
    local names = settings.propagate
    if names and names.unchecked then
        local why = refused_name(names, settings.shim)
        if why then
            return nil, "grpc.init{propagate}: " .. why
        end
        names.unchecked = nil
    end
    local mode = settings.mode or getenv("GRPC_WASM_MODE") or "ffi"
    if not BACKENDS[mode] then
        return nil, "unknown mode '" .. tostring(mode) .. "' (ffi or resty_ffi)"
    end
    local chosen = require(BACKENDS[mode])
    local ok, err = chosen.init()
    if not ok then
        return nil, err
    end
    backend = chosen
    _M.mode = mode
    initialised = ngx.worker.pid()
    start_publishing()
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

-- Only the type: which names exist is the shim's rule, and it answers an
-- unknown one when the call starts.
local function check_compression(compression)
    if compression ~= nil and type(compression) ~= "string" then
        return nil, "compression must be a string (gzip or identity), got " .. type(compression)
    end
    return true
end

-- The phases with a request whose headers a call may carry on.
local REQUEST_PHASES = { rewrite = true, server_rewrite = true, access = true, content = true }

-- The request headers grpc.init{propagate = ...} names (trace context),
-- as the request being served has them: the shim adds those the core's
-- rule lets go (a value metadata can carry, a name the call's own metadata
-- does not set) to the call's metadata. Values go as they came (a -bin
-- header is base64 already).
local function propagated()
    local names = settings.propagate
    if not names or not REQUEST_PHASES[ngx.get_phase()] then
        return nil
    end
    local var = ngx.var
    local out
    for _, name in ipairs(names) do
        local value = var[name[2]]
        if value then
            out = out or {}
            out[name[1]] = value
        end
    end
    return out
end

-- grpc.init's propagate: a list of header names, kept as { key, variable }.
-- A name metadata cannot carry is refused here rather than failing every
-- call that meets it; in init_by_lua (the master, which never loads the
-- shim: a reload must find a replaced library on disk) the names wait for
-- each worker's first use, which refuses them the same way.
local function check_propagate(list, shim)
    if list == nil then
        return nil
    end
    if type(list) ~= "table" then
        return nil, "propagate must be a list of header names, got " .. type(list)
    end
    local names = {}
    for i, name in ipairs(list) do
        if type(name) ~= "string" then
            return nil, "propagate[" .. i .. "] must be a header name, got " .. tostring(name)
        end
        local key = name:lower()
        names[i] = { key, "http_" .. key:gsub("[-.]", "_") }
    end
    if ngx.get_phase() == "init" then
        names.unchecked = true
        return names
    end
    local why = refused_name(names, shim)
    if why then
        return nil, why
    end
    return names
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
-- HTTP/2 flow control; default 4 MiB), compression (how requests are sent:
-- "identity", the default, or "gzip"; a call's own opts.compression wins),
-- propagate (request headers, e.g. { "traceparent", "tracestate" }, that
-- calls made while serving a request carry on as metadata; default none),
-- metrics_dict (the name of a lua_shared_dict where each worker publishes
-- its metrics for grpc.prometheus), metrics_interval (how often, in ms;
-- default 1000).
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
    ok, err = check_compression(opts and opts.compression)
    if not ok then
        return false, err
    end
    ok, err = check_timeout(opts and opts.metrics_interval, "metrics_interval")
    if not ok then
        return false, err
    end
    if opts and opts.metrics_dict ~= nil then
        local dok, derr = metrics.check_dict(opts.metrics_dict)
        if not dok then
            return false, derr
        end
    end
    local cap = opts and opts.max_queued_bytes
    if cap ~= nil and (type(cap) ~= "number" or cap ~= cap or cap < 1) then
        return false, "max_queued_bytes must be a number of bytes (1 or more), got " .. type(cap)
            .. (type(cap) == "number" and " " .. tostring(cap) or "")
    end
    local propagate, perr = check_propagate(opts and opts.propagate, opts and opts.shim)
    if perr then
        return false, perr
    end
    for k, v in pairs(opts or {}) do
        settings[k] = v
    end
    if propagate then
        settings.propagate = propagate
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

--- Reads a whole file; returns true and its content, or false and an
-- error, as every function here does.
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
    return true, data
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

--- This worker's metrics: a list of { name, labels, kind ("counter",
-- "gauge", "histogram"), value } or, for a histogram (milliseconds),
-- { name, labels, kind, count, sum, buckets = { { le, count }, ... } },
-- bucket counts cumulative: true and that list, or false and an error.
function _M.metrics()
    local ok, err = ready()
    if not ok then
        return false, err
    end
    local text, merr = backend.metrics()
    if not text then
        return false, merr
    end
    local entries = metrics.parse(text)
    for _, e in ipairs(entries) do
        e.series, e.label_order = nil, nil
    end
    return true, entries
end

--- Every worker's metrics in Prometheus' text format (0.0.4): counters and
-- histograms totalled over the workers, past ones included (a replaced
-- worker takes nothing away), gauges per worker (label worker), the call
-- duration in seconds (grpc_client_handling_seconds). Needs
-- grpc.init{metrics_dict = ...}, a dict of its own; a worker's latest
-- figures arrive within metrics_interval. True and the text, or false and
-- an error.
function _M.prometheus()
    local ok, err = ready()
    if not ok then
        return false, err
    end
    local dict = settings.metrics_dict
    local dok, derr = metrics.check_dict(dict)
    if not dok then
        return false, derr
    end
    local text, merr = backend.metrics()
    if not text then
        return false, merr
    end
    local pok, perr = metrics.publish(dict, text)
    if not pok then
        return false, perr
    end
    return true, metrics.exposition(ngx.shared[dict])
end

local Conn = {}
Conn.__index = Conn
local Stream = {}
Stream.__index = Stream

-- A TLS option that is present must be usable text: anything else (a
-- boolean, which grpc.readfile returns first, a number) is an error, never
-- plaintext.
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
                .. (type(v) == "boolean" and " (grpc.readfile returns ok, content: pass the content)" or "")
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

-- Metadata as the native side takes it: string keys, lower-cased, and
-- string values; -bin values may hold any bytes and go as base64, as gRPC
-- carries them. What keys and values may hold is the core's one rule,
-- checked natively: a value with a control character comes back as the
-- call's error.
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
        local tv = type(v)
        if tv ~= "string" and tv ~= "number" then
            return nil, "metadata value of '" .. k .. "' must be a string, got " .. tv
        end
        v = tostring(v)
        if k:sub(-4) == "-bin" then
            v = ngx.encode_base64(v)
        end
        out[k] = v
    end
    return out
end

-- A -bin value as the raw bytes gRPC carries as base64 (padded or not),
-- as encode_metadata takes them; text that is no base64 stays as it came.
local function metadata_value(k, v)
    if sub(k, -4) == "-bin" then
        return decode_base64(v) or v
    end
    return v
end

-- key\0value\0 pairs: grpc-metadata-* are headers, grpc-trailer-* trailers.
local function parse_headers(raw)
    local headers, trailers, list = {}, {}, {}
    local find = string.find
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
            headers[sub(k, 15)] = metadata_value(k, v)
        elseif sub(k, 1, 13) == "grpc-trailer-" then
            trailers[sub(k, 14)] = metadata_value(k, v)
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

-- The next event of a call: "message", json | "end", info | nil, err.
local function wait_event(id, timeout_ms, slack_ms)
    local kind, body, http_status, raw, code = backend.next_event(id, timeout_ms, slack_ms)
    if kind ~= "end" then
        return kind, body
    end
    -- The shim always gives one; UNKNOWN keeps a mismatched shim honest.
    if not code or code < 0 then
        code = 2
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
-- for any failed call, INTERNAL unless said otherwise.
local function local_failure(message, code, name)
    code = code or 13
    return failure(setmetatable({ code = code, name = name or "INTERNAL", http_status = 0, raw = "",
                                  body = cjson.encode({ code = code, message = message }) }, Info))
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
    local compression = opts and opts.compression
    local cok, cerr = check_compression(compression)
    if not cok then
        return nil, cerr
    end
    compression = compression or settings.compression
    local id, err = backend.start(conn.id, path, body, timeout, metadata, propagated(), json, compression)
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
-- opts: timeout (ms), metadata (table), raw (true: the response as JSON text),
-- compression ("gzip" or "identity": how the request is sent; default
-- init's). Responses in gzip are always accepted (grpc-accept-encoding).
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

-- A list of names (services to load), or nil.
local function check_names(list, what)
    if list == nil then
        return true
    end
    if type(list) ~= "table" or #list == 0 then
        return nil, what .. " must be a non-empty list of names, got " .. type(list)
    end
    for _, name in ipairs(list) do
        if type(name) ~= "string" or name == "" then
            return nil, what .. " must be a list of names, got a " .. type(name) .. " in it"
        end
    end
    return true
end

--- Loads the services of the connection's server through server
-- reflection (grpc.reflection.v1, else v1alpha), with every file they
-- need: ok, services (their names) | false, err, info. Then they are
-- called as if loaded from files. opts: services (a list: only these;
-- default every service the server lists), timeout (ms, default 10000,
-- the whole load). A file already loaded under the same name stays: if a
-- service then lacks what the server defines, the load fails and adds
-- nothing.
function Conn:reflect(opts)
    local pok, perr = check_phase("conn:reflect")
    if not pok then
        return false, perr
    end
    if self.closed then
        return false, "the connection is closed"
    end
    local ook, oerr = check_opts(opts, "reflect")
    if not ook then
        return false, oerr
    end
    local services = opts and opts.services
    local nok, nerr = check_names(services, "services")
    if not nok then
        return false, nerr
    end
    local tok, terr = check_timeout(opts and opts.timeout)
    if not tok then
        return false, terr
    end
    local timeout = opts and opts.timeout or DEFAULT_TIMEOUT
    local id, err = backend.reflect(self.id, services, timeout)
    if not id then
        return false, err
    end
    -- A thread killed while it waits leaves the load to the collector
    -- (and the shim takes its slot back once its deadline has passed).
    local collect = backend.collect_call
    local handle = ffi_gc(ffi_new("uint32_t[1]", id), function(h) collect(h[0]) end)
    local function done(ended)
        ffi_gc(handle, nil)
        forget(id, ended)
    end
    local deadline = ngx.now() + timeout / 1000
    -- The load's one event is its end, by its deadline: the wait is it
    -- (no module call runs this stream to end it sooner).
    local kind, info = wait_event(id, timeout, 0)
    if kind ~= "end" then
        done()
        if ngx.now() >= deadline then
            return local_failure("deadline of " .. timeout .. " ms exceeded while loading through reflection",
                                 4, "DEADLINE_EXCEEDED")
        end
        return local_failure(info)
    end
    if info.code ~= 0 then
        done(true)
        return failure(info)
    end
    local json, rerr = backend.reflected(id)
    done(true)
    if not json then
        return false, rerr
    end
    return true, cjson.decode(json)
end

--- An OpenAPI 3.1 document (JSON text) of the REST API a transcoder
-- serves for what is loaded: every google.api.http binding an operation,
-- every method at POST /pkg.Service/Method, schemas as calls print JSON
-- (grpc.set_json_options). ok, text | false, err. opts: title,
-- stream_format ("ndjson", "sse" or "array": how the transcoder sends
-- server streams), services (a list: only these).
function _M.openapi(opts)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    local cok, cerr = check_opts(opts, "openapi")
    if not cok then
        return false, cerr
    end
    local json, jerr = "{}", nil
    if opts then
        json, jerr = cjson.encode(opts)
    end
    if not json then
        return false, "cannot encode the openapi options: " .. tostring(jerr)
    end
    local text, derr = backend.openapi(json)
    if not text then
        return false, derr
    end
    return true, text
end

--- What is loaded, as grpcurl list shows it: ok, a list of services, each
-- { name, methods = { { name, path, streaming ("unary",
-- "server_streaming", "client_streaming", "bidi_streaming"), input,
-- output, idempotent } } } | false, err.
function _M.services()
    return _M.describe("")
end

--- The service, method ("pkg.Service/Method" or "pkg.Service.Method"),
-- message (its fields: name, jsonName, number, type, repeated, oneof,
-- map) or enum (its values) called `name`, as grpcurl describe shows it:
-- ok, a table with its kind | false, err.
function _M.describe(name)
    local ok, err = ready()
    if not ok then
        return false, err
    end
    if type(name) ~= "string" then
        return false, "the name must be a string, got " .. type(name)
    end
    local json, derr = backend.describe(name)
    if not json then
        return false, derr
    end
    return true, cjson.decode(json)
end

--- A stream for any streaming kind: send / close_send / recv / close.
-- opts as unary's; with compression = "gzip", stream:send(msg, {compress =
-- false}) sends that one message uncompressed.
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
    return true, setmetatable({ id = id, timeout = timeout, deadline = ngx.now() + timeout / 1000,
                                handle = handle, conn = self }, Stream)
end

-- A server that takes less than its caller sends: what HTTP/2's windows
-- do not let out stays in the transport, and send waits (yielding) while
-- that passes max_queued_bytes, as recv's side holds at most that much;
-- never past the call's deadline.
local function wait_for_room(stream)
    local delay, waited = 0.001, false
    while true do
        local backlog = backend.send_backlog(stream.id)
        if backlog == 0 or (backlog < 0 and not waited) then
            -- Room, or a call already over, whose end recv reports.
            return true
        end
        local left = stream.deadline - ngx.now()
        if backlog < 0 and left > 0.05 then
            return false, "the call ended before the server took this message; recv gives its status"
        end
        if left <= 0.05 then
            -- The deadline (the transport's own may have ended the call
            -- at the same moment).
            return false, "DEADLINE_EXCEEDED (4): deadline of " .. stream.timeout
                .. " ms exceeded while the server took no more of the request"
        end
        ngx.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)
        waited = true
    end
end

function Stream:send(message, opts)
    local pok, perr = check_phase("stream:send")
    if not pok then
        return false, perr
    end
    if self.closed or self.finished then
        return false, "the stream is closed"
    end
    local ook, oerr = check_opts(opts, "send")
    if not ook then
        return false, oerr
    end
    local body, err = encode(message)
    if not body then
        return false, err
    end
    local sok, serr = backend.send(self.id, body, not (opts and opts.compress == false))
    if not sok then
        return false, serr
    end
    return wait_for_room(self)
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
    if self.failure then
        return false, self.failure[1], self.failure[2]
    end
    if self.closed then
        return false, "the stream is closed"
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
        if not self.finished then
            -- Cancelled before its end: that is its end, as gRPC clients
            -- observe it, and what a later recv answers.
            stream_failed(self, local_failure("the stream was cancelled by its caller", 1, "CANCELLED"))
        end
        if not self.forgotten then
            forget(self.id)
        end
        ffi_gc(self.handle, nil)
    end
    return true
end

return _M

-- resty.ffi.grpc.resty_backend: the backend over lua-resty-ffi (mode
-- "resty_ffi", only when asked for). Each operation is a task, as JSON,
-- that the shim's own thread answers; `next` is answered when the call's
-- event comes. The interface it implements is written in resty.ffi.grpc.
local ffi = require("ffi")
local cjson = require("cjson.safe")
local native = require("resty.ffi.grpc.shim")

local ngx = ngx
local type, tostring, tonumber = type, tostring, tonumber
local ffi_string = ffi.string
local settings, find_shim, find_module = native.settings, native.find_shim, native.find_module
local cache_dir, keepalive_of = native.cache_dir, native.keepalive_of

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
    local lok, lib = pcall(ffi.load, shim)
    local older = lok and native.older_build(lib, shim)
    if older then
        return nil, older
    end
    local cfg = cjson.encode({ module = module, cache_dir = cache_dir(), version = native.VERSION,
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

function resty_backend.metrics()
    return task({ op = "metrics" })
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

function resty_backend.start(conn, path, body, timeout, metadata, propagated, json, compression)
    -- The served request's headers as they came, which need not be UTF-8
    -- (JSON's own strings must): length-prefixed pairs in base64, as the
    -- FFI path hands them over, so that the core drops a bad value alone.
    local named = propagated and ngx.encode_base64((native.flatten_pairs(propagated)))
    local id, err = task({ op = "start", conn = conn, path = path, body = body, timeout = timeout,
                           metadata = metadata, propagated = named, json = json,
                           compression = compression })
    return tonumber(id), err
end

function resty_backend.reflect(conn, services, timeout)
    local id, err = task({ op = "reflect", conn = conn, services = services, timeout = timeout })
    return tonumber(id), err
end

function resty_backend.reflected(id)
    return task({ op = "reflected", id = id })
end

function resty_backend.describe(name)
    return task({ op = "describe", name = name })
end

function resty_backend.openapi(json)
    return task({ op = "openapi", options = cjson.decode(json) })
end

function resty_backend.send(id, body, compress)
    return task({ op = "send", id = id, body = body, compress = compress })
end

function resty_backend.send_backlog(id)
    return tonumber(task({ op = "send_backlog", id = id })) or -1
end

function resty_backend.close_send(id)
    return task({ op = "close_send", id = id })
end

-- The wait ends by the call's deadline (and a second of slack), as on the
-- FFI path, even if the event never comes.
function resty_backend.next_event(id, timeout_ms, slack_ms)
    local data, err = task({ op = "next", id = id, timeout = timeout_ms + (slack_ms or 1000) })
    if not data then
        return nil, err
    end
    if data:sub(1, 2) == "M\n" then
        return "message", data:sub(3)
    end
    local http_status, code, hlen, at = data:match("^E (%d+) (%d+) (%d+)\n()")
    if not http_status then
        return nil, "malformed event from the runtime"
    end
    hlen = tonumber(hlen)
    return "end", data:sub(at + hlen), tonumber(http_status), data:sub(at, at + hlen - 1), tonumber(code)
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

return resty_backend

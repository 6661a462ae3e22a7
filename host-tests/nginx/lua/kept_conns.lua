-- Conns a worker keeps by name across requests, so that a test can break
-- and mend what lies under a conn between its calls (keepalive.lua,
-- faults.lua). Not a handler.
local grpc = require("resty.ffi.grpc")

local _M = {}

local conns, loaded = {}, {}

-- The conn named args.name, connected to args.addr on first use with the
-- transport and bounds the request names; `proto` is loaded once.
function _M.get(args, proto)
    if not loaded[proto] then
        local ok, err = grpc.loadfile(proto)
        if not ok then
            return nil, err
        end
        loaded[proto] = true
    end
    local conn = conns[args.name]
    if conn then
        return conn
    end
    local ok, c = grpc.connect(args.addr, {
        transport = args.transport,
        keepalive_interval = tonumber(args.interval),
        keepalive_timeout = tonumber(args.ka_timeout),
        handshake_timeout = tonumber(args.handshake),
    })
    if not ok then
        return nil, c
    end
    conns[args.name] = c
    return c
end

return _M

-- Requests of many sizes over TLS and mTLS, each the first call on a fresh
-- connection (so that its first window of data is written before the TLS
-- handshake ends), then a client stream of three 1 MiB messages. One line
-- per case: "<tls|mtls> <what>: ok" or what went wrong.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/echo.proto"))
local _, ca = assert(grpc.readfile(env.certs .. "/ca.pem"))
local _, cert = assert(grpc.readfile(env.certs .. "/client1.pem"))
local _, priv_key = assert(grpc.readfile(env.certs .. "/client1.key"))
local SERVERS = {
    tls = { env.echo_tls, { host = "example.com", ca = ca } },
    mtls = { env.echo_mtls, { host = "example.com", ca = ca, cert = cert, priv_key = priv_key } },
}

local function fresh(kind)
    local server = SERVERS[kind]
    local opts = {}
    for k, v in pairs(server[2]) do
        opts[k] = v
    end
    local ok, conn = grpc.connect(server[1], opts)
    assert(ok, conn)
    return conn
end

for _, kind in ipairs({ "tls", "mtls" }) do
    for _, size in ipairs({ 65535, 65536, 65537, 70000, 1048576, 4000000 }) do
        local conn = fresh(kind)
        local text = string.rep("a", size)
        local ok, res = conn:unary("/grpc.examples.echo.Echo/UnaryEcho", { message = text }, { timeout = 20000 })
        if ok and res.message == text then
            ngx.say(kind, " ", size, ": ok")
        else
            ngx.say(kind, " ", size, ": ", ok and ("echoed " .. #(res.message or "") .. " bytes") or tostring(res))
        end
        conn:close()
    end
    local conn = fresh(kind)
    local ok, stream = conn:new_stream("/grpc.examples.echo.Echo/ClientStreamingEcho", { timeout = 20000 })
    assert(ok, stream)
    local piece = string.rep("b", 1048576)
    local sent = true
    for _ = 1, 3 do
        sent = sent and stream:send({ message = piece })
    end
    stream:close_send()
    local rok, res = stream:recv()
    if sent and rok and res and #res.message == 3 * 1048576 + 2 then
        ngx.say(kind, " stream of 3 MiB: ok")
    else
        local got = rok and #(res and res.message or "") or tostring(res)
        ngx.say(kind, " stream of 3 MiB: ", tostring(sent), " ", tostring(rok), " ", got)
    end
    stream:close()
    conn:close()
end

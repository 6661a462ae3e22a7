-- The program from the lua-shim issue, with the test servers' addresses.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
assert(grpc.loadfile(env.protos .. "/route_guide.proto"))
assert(grpc.loadfile(env.protos .. "/echo.proto"))

local ok, conn = grpc.connect(env.greeter)
assert(ok, conn)
local ok, res = conn:unary("/helloworld.Greeter/SayHello", {name = "foobar"})
assert(ok, res)
assert(res.message == "Hello foobar!")
ngx.say("unary: ", res.message)

-- tls/mtls enabled unary call
local _, ca = assert(grpc.readfile(env.certs .. "/ca.pem"))
local _, cert = assert(grpc.readfile(env.certs .. "/client1.pem"))
local _, priv_key = assert(grpc.readfile(env.certs .. "/client1.key"))
local ok, tconn = grpc.connect(env.echo_mtls, {
    host = "example.com",
    ca = ca,
    cert = cert,
    priv_key = priv_key,
})
assert(ok, tconn)
local ok, res = tconn:unary("/grpc.examples.echo.Echo/UnaryEcho", {message = "hello"})
assert(ok and res.message == "hello", res)
ngx.say("mtls: ", res.message)

-- server streaming
local ok, rconn = grpc.connect(env.routeguide)
local ok, stream = rconn:new_stream("/routeguide.RouteGuide/ListFeatures")
assert(ok, stream)
assert(stream:send({lo = {latitude = 400000000, longitude = -750000000},
                    hi = {latitude = 420000000, longitude = -730000000}}))
assert(stream:close_send())
local count = 0
while true do
    local ok, res = stream:recv()
    assert(ok, res)
    if not res then break end
    count = count + 1
    ngx.say(cjson.encode(res))
end
ngx.say("server streaming: ", count, " features")
stream:close()

-- client streaming: 3 points, one summary, then the end
local ok, stream = rconn:new_stream("/routeguide.RouteGuide/RecordRoute")
for i = 0, 2 do
    assert(stream:send({latitude = 409012345 + i * 1000000, longitude = -742567890}))
end
assert(stream:close_send())
local ok, summary = stream:recv()
assert(ok, summary)
ngx.say("client streaming: points ", summary.pointCount, " features ", summary.featureCount or 0)
local ok, res = stream:recv()
assert(ok and res == nil)
ngx.say("client streaming end: ", tostring(res))
stream:close()

-- bidi: a note, then what comes back, three times at one location
local ok, stream = rconn:new_stream("/routeguide.RouteGuide/RouteChat")
for i = 1, 3 do
    assert(stream:send({location = {latitude = 1, longitude = 2}, message = "note " .. i}))
    local got = {}
    for _ = 1, i - 1 do
        local ok, note = stream:recv()
        assert(ok, note)
        got[#got + 1] = note.message
    end
    ngx.say("bidi ", i, ": ", table.concat(got, ","))
end
assert(stream:close_send())
local ok, res = stream:recv()
ngx.say("bidi end: ", tostring(ok), " ", tostring(res))
stream:close()
conn:close()
tconn:close()
rconn:close()

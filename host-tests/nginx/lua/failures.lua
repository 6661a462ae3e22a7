-- Every failure a caller can meet, one line each: ok, err, code.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
assert(grpc.loadfile(env.protos .. "/echo.proto"))
assert(grpc.loadfile(env.protos .. "/testing.proto"))

local function show(name, ok, err, info)
    ngx.say(name, ": ", tostring(ok), " | ", tostring(err), " | ", info and info.code or "-")
end

-- server down: UNAVAILABLE well within the deadline
local ok, dead = grpc.connect(env.dead)
ngx.update_time()
local started = ngx.now()
local ok, err, info = dead:unary("/helloworld.Greeter/SayHello", {name = "x"}, {timeout = 3000})
ngx.update_time()
show("down", ok, info and info.name, info)
ngx.say("down fast: ", tostring(ngx.now() - started < 3))

local ok, conn = grpc.connect(env.testing)
-- deadline exceeded
ngx.update_time()
started = ngx.now()
local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = 5000}, {timeout = 300})
ngx.update_time()
show("deadline", ok, info and info.name, info)
-- The server sleeps 5 s: the bound leaves a loaded machine its margin.
ngx.say("deadline in time: ", tostring(ngx.now() - started < 3))

-- a status with details
local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Fail",
                                 {code = 5, message = "no such book", withDetails = true})
show("details", ok, err, info)
ngx.say("details[1]: ", info.details[1]["@type"], " ", info.details[1].reason)
ngx.say("details[2]: ", info.details[2]["@type"], " ", info.details[2].fieldViolations[1].field)

-- an unknown method
local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Nope", {})
show("unknown method", ok, err, info)

-- a field of the wrong type
local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = {1, 2}})
show("wrong type", ok, err, info)
local ok, err = conn:unary("/grpcwasm.testing.Testing/Sleep", 42)
show("not a table", ok, err)

-- metadata in, headers and trailers out
local ok, res, info = conn:unary("/grpcwasm.testing.Testing/EchoMetadata", {},
                                 {metadata = {["x-echo-user"] = "ann", ["trace-bin"] = "\1\2"}})
ngx.say("metadata: ", tostring(ok), " ", res.metadata["x-echo-user"], " ", tostring(res.metadata["trace-bin"]),
        " header ", tostring(info.headers["x-echo-user"]), " trailer ", tostring(info.trailers["x-echo-user-trailer"]))

-- TLS: the wrong CA, the wrong server name
local _, ca = assert(grpc.readfile(env.certs .. "/other-ca.pem"))
local ok, tls = grpc.connect(env.echo_tls, {host = "example.com", ca = ca})
local ok, err, info = tls:unary("/grpc.examples.echo.Echo/UnaryEcho", {message = "x"}, {timeout = 3000})
show("wrong ca", ok, info and info.name, info)
local _, right_ca = assert(grpc.readfile(env.certs .. "/ca.pem"))
local ok, tls = grpc.connect(env.echo_tls, {host = "wrong.example.org", ca = right_ca})
local ok, err, info = tls:unary("/grpc.examples.echo.Echo/UnaryEcho", {message = "x"}, {timeout = 3000})
show("wrong name", ok, info and info.name, info)
local ok, err = grpc.connect(env.echo_tls, {ca = "not pem"})
show("bad pem", ok, err)

-- a conn used after close
conn:close()
local ok, err = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = 1})
show("after close", ok, err)
local ok, err = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
show("stream after close", ok, err)

-- an error after streamed messages
local ok, conn = grpc.connect(env.testing)
local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
stream:send({count = 2, code = 9, message = "stop"})
stream:close_send()
local got = 0
while true do
    local ok, res, info = stream:recv()
    if not ok then
        ngx.say("stream error after ", got, ": ", res)
        break
    end
    if not res then break end
    got = got + 1
end
local ok, res = stream:recv()
ngx.say("recv after end: ", tostring(ok), " ", tostring(res))
stream:close()

-- loading errors
local ok, err = grpc.loadfile(env.protos .. "/missing.proto")
show("missing file", ok, err)
local ok, err = grpc.connect(42)
show("bad address", ok, err)

-- conns and streams left to the garbage collector
for _ = 1, 20 do
    local _, c = grpc.connect(env.testing)
    local _, s = c:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
end
collectgarbage("collect")
collectgarbage("collect")
ngx.say("collected: ok")

-- per-call JSON options
local ok, conn = grpc.connect(env.testing)
local ok, res = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = 0},
                           {json = {emit_defaults = true, proto_field_names = true, int64_as_number = true}})
ngx.say("json options: ", tostring(ok), " ", type(res.slept_millis), " ", tostring(res.sleptMillis))
local ok, err = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = 0}, {json = {pretty = true}})
ngx.say("bad json option: ", tostring(ok), " ", err)
local ok, err = conn:unary("not a path", {})
ngx.say("bad path: ", tostring(ok), " ", err)

-- a stream the caller cancels: its end is CANCELLED; one that ended first
-- keeps its own end
local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
stream:send({count = 1000, intervalMillis = 20})
stream:close_send()
local ok1 = stream:recv()
stream:close()
local ok2, err, info = stream:recv()
ngx.say("recv after cancel: ", tostring(ok1), " ", tostring(ok2), " ", err, " ", info and info.code)
local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
stream:send({count = 0})
stream:close_send()
local ok1, res = stream:recv()
stream:close()
local ok2, err = stream:recv()
ngx.say("recv after end and close: ", tostring(ok1), " ", tostring(res), " ", tostring(ok2), " ", err)

-- Known traffic for the metrics test: per request, one call that succeeds,
-- one the server fails NOT_FOUND, one the module refuses (unknown field).
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

if not package.loaded.metrics_conns then
    assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
    assert(grpc.loadfile(env.protos .. "/testing.proto"))
    local _, greeter = grpc.connect(env.greeter)
    local _, testing = grpc.connect(env.testing)
    package.loaded.metrics_conns = { greeter = greeter, testing = testing }
end
local conns = package.loaded.metrics_conns
local ok, res = conns.greeter:unary("/helloworld.Greeter/SayHello", {name = "m"})
ngx.say("ok: ", tostring(ok), " ", ok and res.message or tostring(res))
local _, _, info = conns.testing:unary("/grpcwasm.testing.Testing/Fail", {code = 5, message = "gone"})
ngx.say("fail: ", info and info.name)
_, _, info = conns.greeter:unary("/helloworld.Greeter/SayHello", {nope = 1})
ngx.say("refused: ", info and info.name)
ngx.say("worker: ", ngx.worker.id(), " ", ngx.worker.pid())

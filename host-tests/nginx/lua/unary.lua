-- One unary call per request (the concurrency test and the benchmark).
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

if not package.loaded.grpc_conn then
    assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
    local ok, conn = grpc.connect(env.greeter)
    assert(ok, conn)
    package.loaded.grpc_conn = conn
end
local ok, res = package.loaded.grpc_conn:unary("/helloworld.Greeter/SayHello", {name = "load"})
if not ok then
    ngx.status = 500
    ngx.say(res)
    return
end
ngx.say(res.message)

-- One call with the wake-up socket in the test's own directory.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.init{ socket_dir = env.socket_dir })
assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
local _, conn = grpc.connect(env.greeter)
local ok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "s" })
ngx.say(tostring(ok), " ", ok and res.message or tostring(res))

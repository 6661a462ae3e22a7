-- A unary answer larger than the 4 MiB a message may have: the status.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(env.testing)
assert(ok, conn)
local ok, err = conn:unary("/grpcwasm.testing.Testing/Large", { size = 5000000 })
ngx.say(tostring(ok), " ", tostring(err))

-- A plaintext call to a TLS server: the error says it may want TLS.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/echo.proto"))
local _, conn = grpc.connect(env.echo_tls, { transport = ngx.var.arg_transport })
local ok, err, info = conn:unary("/grpc.examples.echo.Echo/UnaryEcho", { message = "x" }, { timeout = 5000 })
ngx.say(tostring(ok), " | ", info and info.name, " | ", tostring(err))

-- grpc.init{propagate} from a request (not init_by_lua), then a call whose
-- server says what it received: on the lua-resty-ffi path too, the named
-- headers reach the shim, and the core's rule decides which go.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson.safe")
local env = require("testenv")

assert(grpc.init{ propagate = { "traceparent", "x-request-id" } })
assert(grpc.loadfile(env.protos .. "/testing.proto"))
local _, conn = grpc.connect(env.testing)
local ok, res = conn:unary("/grpcwasm.testing.Testing/EchoMetadata", {},
    { metadata = { ["x-request-id"] = ngx.var.arg_own } })
assert(ok, res)
ngx.say(cjson.encode(res.metadata))

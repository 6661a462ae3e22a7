-- What the server received: trace context carried on from this request
-- (grpc.init{propagate = ...}), the caller's own value winning, and the
-- user-agent.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson.safe")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local _, conn = grpc.connect(env.testing)
local ok, res = conn:unary("/grpcwasm.testing.Testing/EchoMetadata", {},
    { metadata = { ["x-request-id"] = ngx.var.arg_own } })
assert(ok, res)
ngx.say(cjson.encode(res.metadata))

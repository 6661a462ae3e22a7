-- grpc.version; with ?claim=<v>, what init says when resty.ffi.grpc claims
-- version <v> before this worker's first use (a shim of another release).
local shim = require("resty.ffi.grpc.shim")
if ngx.var.arg_claim then
    shim.VERSION = ngx.var.arg_claim
end
local grpc = require("resty.ffi.grpc")
local ok, err = grpc.init()
ngx.say(grpc.version, " ", grpc._VERSION, " ", tostring(ok), " ", tostring(err))

-- Which way in resty.ffi.grpc took in this worker.
local grpc = require("resty.ffi.grpc")
assert(grpc.init())
ngx.say(grpc.mode)

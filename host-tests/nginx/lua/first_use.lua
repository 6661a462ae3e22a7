-- A worker's first use of the module (grpc.loadfile sets the worker up):
-- what it answers.
local grpc = require("resty.ffi.grpc")
local ok, err = grpc.loadfile(require("testenv").protos .. "/testing.proto")
ngx.say(tostring(ok), " ", tostring(err))

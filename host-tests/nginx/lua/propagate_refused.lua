-- What grpc.init says of a reserved header in propagate.
local ok, err = require("resty.ffi.grpc").init{ propagate = { ngx.var.arg_name } }
ngx.say(tostring(ok), " ", tostring(err))

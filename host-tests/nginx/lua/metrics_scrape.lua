-- The README's /metrics location.
local text, err = require("resty.ffi.grpc").prometheus()
if not text then
    ngx.status = 500
    ngx.say(err)
    return
end
ngx.print(text)

-- The README's /metrics location.
local ok, text = require("resty.ffi.grpc").prometheus()
if not ok then
    ngx.status = 500
end
ngx.print(text)

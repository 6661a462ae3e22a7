-- This worker's metrics as grpc.metrics() gives them, as JSON.
local cjson = require("cjson.safe")
local ok, entries = require("resty.ffi.grpc").metrics()
if not ok then
    ngx.status = 500
    ngx.say(entries)
    return
end
ngx.say(cjson.encode({ worker = ngx.worker.id(), metrics = entries }))

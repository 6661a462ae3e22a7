-- This worker's metrics as grpc.metrics() gives them, as JSON.
local cjson = require("cjson.safe")
local entries, err = require("resty.ffi.grpc").metrics()
if not entries then
    ngx.status = 500
    ngx.say(err)
    return
end
ngx.say(cjson.encode({ worker = ngx.worker.id(), metrics = entries }))

-- grpc.openapi: the document of what this worker loaded, and its failures.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/library.proto"))
local args = ngx.req.get_uri_args()
if args.bad then
    local ok, err = grpc.openapi({stream_format = "xml"})
    ngx.say("bad format: ", tostring(ok), " | ", err)
    ok, err = grpc.openapi({pretty = true})
    ngx.say("unknown: ", tostring(ok), " | ", err)
    ok, err = grpc.openapi("x")
    ngx.say("not a table: ", tostring(ok), " | ", err)
    return
end
local ok, document = grpc.openapi({title = "Library", stream_format = args.format,
                                   services = {"example.library.v1.Library"}})
if not ok then
    ngx.status = 500
    return ngx.say(document)
end
ngx.header["content-type"] = "application/json"
ngx.print(document)

-- What this worker learns of ?addr through reflection, as JSON: the
-- services (grpc.services), a description of each of ?names (grpc.describe,
-- comma-separated), and the answer of each ?call (a method) to ?request.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson")

local args = ngx.req.get_uri_args()
local ok, conn = grpc.connect(args.addr)
assert(ok, conn)
local ok, services = conn:reflect()
if not ok then
    ngx.status = 502
    return ngx.say(services)
end
local out = { reflected = services, described = {} }
ok, out.services = grpc.services()
assert(ok, out.services)
for name in (args.names or ""):gmatch("[^,]+") do
    local dok, description = grpc.describe(name)
    out.described[name] = dok and description or cjson.null
end
if args.call then
    local cok, res, info = conn:unary(args.call, args.request)
    out.answer = cok and res or { error = res, code = info and info.code }
end
ngx.say(cjson.encode(out))

-- Calls from phases that cannot yield answer false, err; the init_by_lua
-- results are reported here too. The conn is made before the first output,
-- which runs the header filter.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")
assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
local ok, conn = grpc.connect(env.greeter)
assert(ok, conn)
ngx.ctx.conn = conn
local ok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "content" })
ngx.say("init: ", PHASE_INIT) -- luacheck: ignore
ngx.say("init loadfile: ", PHASE_LOAD) -- luacheck: ignore
ngx.say("content: ", tostring(ok), " ", res.message)

-- The compiled-module cache: init with the cache directory and module the
-- test names, then one call. Prints the call's answer or init's error.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

local args = ngx.req.get_uri_args()
local ok, err = grpc.init({ cache_dir = env.cache_dir, module = args.module or env.wasm })
if not ok then
    ngx.say("init: ", err)
    return
end
assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
local _, conn = grpc.connect(env.greeter)
local cok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "cache" }, { timeout = 5000 })
ngx.say(cok and res.message or ("failed: " .. tostring(res)))

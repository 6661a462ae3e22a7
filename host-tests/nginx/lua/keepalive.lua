-- One unary call on a conn this worker keeps across requests (by name), so
-- that the test can break and mend what lies under it between calls.
-- Answers "ok | <reply> | <ms>" or "failed | <err> | <ms>".
local env = require("testenv")
local kept_conns = require("kept_conns")

local args = ngx.req.get_uri_args()
local conn, err = kept_conns.get(args, env.protos .. "/helloworld.proto")
if not conn then
    ngx.say("connect failed | ", err)
    return
end
ngx.update_time()
local started = ngx.now()
local ok, res = conn:unary("/helloworld.Greeter/SayHello", { name = args.name },
                           { timeout = tonumber(args.timeout) })
ngx.update_time()
local ms = math.floor((ngx.now() - started) * 1000 + 0.5)
if ok then
    ngx.say("ok | ", res.message, " | ", ms)
else
    ngx.say("failed | ", res, " | ", ms)
end

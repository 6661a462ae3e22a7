-- One unary call on a conn this worker keeps across requests (by name), so
-- that the test can break and mend what lies under it between calls.
-- Answers "ok | <reply> | <ms>" or "failed | <err> | <ms>".
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

local kept = package.loaded.keepalive_conns or {}
package.loaded.keepalive_conns = kept
if not kept[1] then
    assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
    kept[1] = true
end

local args = ngx.req.get_uri_args()
local conn = kept[args.name]
if not conn then
    local ok, c = grpc.connect(args.addr, {
        transport = args.transport,
        keepalive_interval = tonumber(args.interval),
        keepalive_timeout = tonumber(args.ka_timeout),
        handshake_timeout = tonumber(args.handshake),
    })
    if not ok then
        ngx.say("connect failed | ", c)
        return
    end
    kept[args.name] = c
    conn = c
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

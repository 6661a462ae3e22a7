-- Issue 14, "found in real hosts". ?case=init: grpc.init with ?mode= and
-- ?module= (absent: the defaults); prints init's answer and the way in.
-- ?case=idle: a call, ?sleep= seconds with the connection idle (past
-- ?idle= ms of idle_timeout), and a call again.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")
local args = ngx.req.get_uri_args()

if args.case == "init" then
    local ok, err = grpc.init({ mode = args.mode, module = args.module or false })
    ngx.say("init: ", tostring(ok), " ", tostring(err), " mode: ", tostring(grpc.mode))
    if not ok then
        return
    end
    assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
    local cok, conn = grpc.connect(env.greeter)
    assert(cok, conn)
    local uok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "host" })
    ngx.say("unary: ", tostring(uok), " ", uok and res.message or tostring(res))
    conn:close()
elseif args.case == "idle" then
    assert(grpc.init({ idle_timeout = tonumber(args.idle) }))
    assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
    local cok, conn = grpc.connect(env.greeter)
    assert(cok, conn)
    for i = 1, 2 do
        local ok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "idle " .. i })
        ngx.say(tostring(ok), " ", ok and res.message or tostring(res))
        if i == 1 then
            ngx.sleep(tonumber(args.sleep))
        end
    end
    conn:close()
end

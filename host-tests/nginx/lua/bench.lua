-- The Lua side of `make bench-lua`: ?calls=N&concurrency=C SayHello calls
-- from this one request handler (C light threads share the N calls), over
-- the connection kind ?transport= names (runtime or cosocket).
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
local ok, conn = grpc.connect(env.greeter, {transport = ngx.var.arg_transport})
assert(ok, conn)

local calls = tonumber(ngx.var.arg_calls) or 100000
local concurrency = tonumber(ngx.var.arg_concurrency) or 1
local failures = 0

local function worker(n)
    for _ = 1, n do
        local ok, res = conn:unary("/helloworld.Greeter/SayHello", {name = "bench"})
        if not ok or res.message ~= "Hello bench!" then
            failures = failures + 1
        end
    end
end

ngx.update_time()
local started = ngx.now()
local threads = {}
for i = 1, concurrency do
    local share = math.floor(calls / concurrency) + ((i <= calls % concurrency) and 1 or 0)
    threads[i] = ngx.thread.spawn(worker, share)
end
for i = 1, concurrency do
    ngx.thread.wait(threads[i])
end
ngx.update_time()
ngx.say("seconds ", string.format("%.3f", ngx.now() - started), " failures ", failures)
conn:close()

-- 1000 calls in flight at once in one worker, on one connection: each
-- sleeps 300 ms at the server, so together they take about that long
-- only if they really overlap.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(env.testing)
local n = tonumber(ngx.var.arg_n) or 1000
local done, failed, first_error = 0, 0, nil
local function one()
    local ok, res = conn:unary("/grpcwasm.testing.Testing/Sleep", {millis = 300}, {timeout = 20000})
    if ok then
        done = done + 1
    else
        failed = failed + 1
        first_error = first_error or res
    end
end
ngx.update_time()
local started = ngx.now()
local threads = {}
for i = 1, n do
    threads[i] = ngx.thread.spawn(one)
end
for i = 1, n do
    ngx.thread.wait(threads[i])
end
ngx.update_time()
ngx.say("done ", done, " failed ", failed, " seconds ", string.format("%.1f", ngx.now() - started),
        first_error and (" first error: " .. first_error) or "")
conn:close()

-- A stream whose server dies in the middle (the test kills it).
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(ngx.var.arg_addr)
local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail", {timeout = 20000})
stream:send({count = 1000, intervalMillis = 50})
stream:close_send()
local got = 0
while true do
    local ok, res, info = stream:recv()
    if not ok then
        ngx.say("after ", got > 0 and "some" or "none", ": ", info and info.name or res)
        break
    end
    if not res then
        ngx.say("ended without error")
        break
    end
    got = got + 1
    if got == 1 then
        -- The test's marker to kill the server (nginx_harness.wait_for_log).
        ngx.log(ngx.INFO, "midstream first message")
    end
end
stream:close()

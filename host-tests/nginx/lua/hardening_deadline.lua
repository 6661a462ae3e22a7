-- A unary call whose deadline passes while the server still works (a
-- grpcio server that sleeps and ignores deadlines), on both transports.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
for _, transport in ipairs({ "runtime", "cosocket" }) do
    local _, conn = grpc.connect(env.sleeper, { transport = transport })
    ngx.update_time()
    local started = ngx.now()
    local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Sleep", { millis = 3000 }, { timeout = 300 })
    ngx.update_time()
    ngx.say(transport, ": ", tostring(ok), " | ", tostring(err), " | ", info and info.code or "-",
            " | in time: ", tostring(ngx.now() - started < 2.5))
    conn:close()
end

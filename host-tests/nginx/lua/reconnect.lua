-- One conn across a server restart (the test stops and restarts the
-- server): ok, then UNAVAILABLE while it is down, then ok again.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/helloworld.proto"))
local ok, conn = grpc.connect(ngx.var.arg_addr)
local seen = {}
local last
-- Bounded by time, not a count of tries: the test waits for each marker.
ngx.update_time()
local give_up = ngx.now() + 30
while ngx.now() < give_up do
    local ok, res, info = conn:unary("/helloworld.Greeter/SayHello", {name = "again"}, {timeout = 1000})
    local now = ok and "ok" or (info and info.name or res)
    if now ~= last then
        seen[#seen + 1] = now
        last = now
        -- The test's marker to kill or restart the server.
        ngx.log(ngx.INFO, "reconnect seen ", #seen, " ", now)
    end
    if #seen == 3 then
        break
    end
    ngx.sleep(0.1)
end
ngx.say(table.concat(seen, ","))

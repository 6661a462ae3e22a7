-- A stream whose conn table nobody holds any more keeps its connection:
-- collecting the conn must not reset a stream still in use.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))

local function open_stream()
    local ok, conn = grpc.connect(env.testing)
    assert(ok, conn)
    local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
    assert(ok, stream)
    assert(stream:send({count = 3, intervalMillis = 50}))
    assert(stream:close_send())
    return stream
end

local stream = open_stream()
collectgarbage("collect")
collectgarbage("collect")
local got = {}
while true do
    local ok, item, info = stream:recv()
    if not ok then
        got[#got + 1] = "error " .. tostring(item)
        break
    end
    if not item then
        break
    end
    got[#got + 1] = tostring(item.index or 0)
end
ngx.say(table.concat(got, ","))
stream:close()

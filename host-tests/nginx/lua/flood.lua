-- A server stream that the caller leaves unread for `hold` seconds, then
-- reads `read` messages of, checking each one's index and payload.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

local kept = package.loaded.flood_state or {}
package.loaded.flood_state = kept
if not kept.loaded then
    assert(grpc.loadfile(env.flood_proto))
    kept.loaded = true
end

local args = ngx.req.get_uri_args()
local count, size = tonumber(args.count), tonumber(args.size)
local ok, conn = grpc.connect(env.flood, { transport = args.transport })
assert(ok, conn)
local ok, stream = conn:new_stream("/flood.Flood/Pour", { timeout = 60000 })
assert(ok, stream)
assert(stream:send({ count = count, size = size }))
assert(stream:close_send())
if tonumber(args.hold) > 0 then
    ngx.sleep(tonumber(args.hold))
end
-- The test's marker: what the server sent until here was sent unread.
ngx.log(ngx.INFO, "flood reading")

local want = tonumber(args.read)
local read = 0
while read < want do
    local ok, msg, info = stream:recv()
    if not ok or msg == nil then
        ngx.say("recv ", read, ": ", tostring(ok), " ", tostring(msg))
        return
    end
    local payload = ngx.decode_base64(msg.payload or "")
    -- proto3 JSON leaves out the index 0.
    if (msg.index or 0) ~= read or payload ~= string.rep(string.char(read % 251), size) then
        ngx.say("message ", read, ": index ", tostring(msg.index), ", ", #payload, " bytes")
        return
    end
    read = read + 1
end
stream:close()
conn:close()
ngx.say("read ", read, " in order")

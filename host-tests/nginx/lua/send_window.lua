-- A client stream to a server of the test's choice: `count` sends of
-- `size` bytes each, until one fails (then its end, unless recv=0). The answer is "<sends that
-- returned true> | <ms spent sending> | <the failure, or nil>".
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

local kept = package.loaded.send_window_state or {}
package.loaded.send_window_state = kept
if not kept.loaded then
    assert(grpc.loadfile(env.sink_proto))
    kept.loaded = true
end

local args = ngx.req.get_uri_args()
local ok, conn = grpc.connect(args.addr, { transport = args.transport })
assert(ok, conn)
local ok, stream = conn:new_stream("/sink.Sink/Pour", { timeout = tonumber(args.timeout) })
assert(ok, stream)
local chunk = { data = ngx.encode_base64(string.rep("x", tonumber(args.size))) }
local accepted, failure = 0, nil
ngx.update_time()
local started = ngx.now()
for _ = 1, tonumber(args.count) do
    local sok, err = stream:send(chunk)
    if not sok then
        failure = err
        break
    end
    accepted = accepted + 1
end
ngx.update_time()
local elapsed = math.floor((ngx.now() - started) * 1000 + 0.5)
if not failure and args.recv ~= "0" then
    -- Every send went: the call's end says whether they were sent.
    local _, res = stream:recv()
    failure = "recv: " .. tostring(res)
end
ngx.say(accepted, " | ", elapsed, " | ", tostring(failure))
stream:close()
conn:close()

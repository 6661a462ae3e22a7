-- Results that never lie: a message that cannot be decoded, a failure read
-- twice, a .proto that parses but does not compile.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson.safe")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
assert(grpc.loadfile(env.protos .. "/route_guide.proto"))

local function show(name, ok, err, info)
    ngx.say(name, ": ", tostring(ok), " | ", tostring(err), " | ", info and info.code or "-",
            " ", info and info.name or "-")
end

-- A streamed message the JSON decoder refuses (nested deeper than it allows).
local _, rg = grpc.connect(env.routeguide)
local _, stream = rg:new_stream("/routeguide.RouteGuide/ListFeatures", { timeout = 5000 })
stream:send({ lo = { latitude = 400000000, longitude = -750000000 },
              hi = { latitude = 420000000, longitude = -730000000 } })
stream:close_send()
cjson.decode_max_depth(1)
local ok, err, info = stream:recv()
cjson.decode_max_depth(1000)
show("undecodable message", ok, err, info)
show("recv again", stream:recv())
stream:close()

-- The same in a unary call that streams (its messages are gathered).
cjson.decode_max_depth(1)
local ok, err, info = rg:unary("/routeguide.RouteGuide/ListFeatures",
                               { lo = { latitude = 400000000, longitude = -750000000 },
                                 hi = { latitude = 420000000, longitude = -730000000 } }, { timeout = 5000 })
cjson.decode_max_depth(1000)
show("undecodable unary", ok, err, info)

-- A failure, read again.
local _, conn = grpc.connect(env.testing)
local _, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail", { timeout = 5000 })
stream:send({ count = 1, code = 9, message = "stop" })
stream:close_send()
local ok, msg = stream:recv()
ngx.say("first: ", tostring(ok), " ", cjson.encode(msg))
show("failure", stream:recv())
show("failure again", stream:recv())
stream:close()

-- A .proto that parses but does not compile is not kept.
show("bad proto", grpc.loadfile(env.tmp .. "/bad/hardening.proto"))
-- A syntax error names its file, line and column, as a compile error does.
show("syntax error", grpc.loadfile(env.tmp .. "/syntax/hardening.proto"))
show("fixed proto", grpc.loadfile(env.tmp .. "/good/hardening.proto"))
local ok, res = conn:unary("/grpcwasm.testing.Testing/Sleep", { millis = 0 }, { timeout = 5000 })
ngx.say("later call: ", tostring(ok), " ", cjson.encode(res))

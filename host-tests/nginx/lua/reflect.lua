-- conn:reflect: services from the server itself, then calls of every
-- kind with no .proto file loaded; each failure a line. One worker
-- loads what it reflects: the whole script runs in one request.
local grpc = require("resty.ffi.grpc")
local cjson = require("cjson")
local env = require("testenv")

local function show(name, ok, err, info)
    ngx.say(name, ": ", tostring(ok), " | ", tostring(err), " | ", info and info.code or "-")
end

-- Nothing is loaded yet: the method is unknown.
local ok, rconn = grpc.connect(env.routeguide_v1)
assert(ok, rconn)
local ok, err, info = rconn:unary("/routeguide.RouteGuide/GetFeature", {latitude = 1})
show("before", ok, err, info)

-- grpc.reflection.v1 (tonic)
local ok, services = rconn:reflect()
ngx.say("v1: ", tostring(ok), " ", ok and table.concat(services, ",") or services)

local ok, feature = rconn:unary("/routeguide.RouteGuide/GetFeature",
                                {latitude = 409012345, longitude = -742567890})
assert(ok, feature)
ngx.say("unary: ", feature.name)

local ok, stream = rconn:new_stream("/routeguide.RouteGuide/ListFeatures")
assert(ok, stream)
assert(stream:send({lo = {latitude = 400000000, longitude = -750000000},
                    hi = {latitude = 420000000, longitude = -730000000}}))
assert(stream:close_send())
local count = 0
while true do
    local ok, res = stream:recv()
    assert(ok, res)
    if not res then break end
    count = count + 1
end
ngx.say("server streaming: ", count)

local ok, stream = rconn:new_stream("/routeguide.RouteGuide/RouteChat")
assert(ok, stream)
assert(stream:send({location = {latitude = 1, longitude = 1}, message = "one"}))
assert(stream:send({location = {latitude = 1, longitude = 1}, message = "two"}))
assert(stream:close_send())
local notes = {}
while true do
    local ok, res = stream:recv()
    assert(ok, res)
    if not res then break end
    notes[#notes + 1] = res.message
end
ngx.say("bidi: ", table.concat(notes, ","))

-- Reflected again: the same files, kept once.
local ok, services = rconn:reflect({services = {"routeguide.RouteGuide"}})
ngx.say("again: ", tostring(ok), " ", ok and table.concat(services, ",") or services)

-- grpc.reflection.v1alpha only (an older server): asked after v1 is
-- UNIMPLEMENTED.
local ok, gconn = grpc.connect(env.greeter_v1alpha)
assert(ok, gconn)
local ok, services = gconn:reflect({services = {"helloworld.Greeter"}})
ngx.say("v1alpha: ", tostring(ok), " ", ok and table.concat(services, ",") or services)
local ok, res = gconn:unary("/helloworld.Greeter/SayHello", {name = "reflection"})
ngx.say("greeter: ", ok and res.message or res)

-- grpcio's reflection (a second stack), v1alpha
local ok, sconn = grpc.connect(env.shelves)
assert(ok, sconn)
local ok, services = sconn:reflect()
ngx.say("grpcio: ", tostring(ok), " ", ok and table.concat(services, ",") or services)
local ok, shelf = sconn:unary("/shelves.Bookstore/GetShelf", {shelf = 7})
ngx.say("grpcio call: ", ok and cjson.encode(shelf) or shelf)

-- What is loaded now, as grpcurl list / describe show it.
local ok, list = grpc.services()
assert(ok, list)
local names = {}
for _, service in ipairs(list) do
    names[#names + 1] = service.name .. "(" .. #service.methods .. ")"
end
table.sort(names)
ngx.say("services: ", table.concat(names, ","))
local ok, chat = grpc.describe("routeguide.RouteGuide/RouteChat")
ngx.say("describe: ", chat.streaming, " ", chat.input, " ", chat.output)
local ok, err = grpc.describe("routeguide.Nope")
ngx.say("describe unknown: ", tostring(ok), " | ", err)

-- Failures: ok is false, with the gRPC code.
local ok, plain = grpc.connect(env.greeter)
local ok, err, info = plain:reflect()
show("no reflection", ok, err, info)
local ok, err, info = rconn:reflect({services = {"routeguide.Nope"}})
show("unknown service", ok, err, info)
local ok, dead = grpc.connect(env.dead)
local ok, err, info = dead:reflect({timeout = 3000})
show("down", ok, info and info.name, info)
local ok, silent = grpc.connect(env.silent)
ngx.update_time()
local started = ngx.now()
local ok, err, info = silent:reflect({timeout = 500})
ngx.update_time()
show("deadline", ok, err, info)
ngx.say("deadline in time: ", tostring(ngx.now() - started < 1.5))
local ok, err = rconn:reflect({services = "routeguide.RouteGuide"})
show("services not a list", ok, err)
local ok, err = rconn:reflect({services = {}})
show("services empty", ok, err)
local ok, err = rconn:reflect({timeout = -1})
show("bad timeout", ok, err)
local ok, err = rconn:reflect("x")
show("opts not a table", ok, err)
-- The server still answers after each failure.
local ok, feature = rconn:unary("/routeguide.RouteGuide/GetFeature",
                                {latitude = 409012345, longitude = -742567890})
ngx.say("after: ", ok and feature.name or feature)

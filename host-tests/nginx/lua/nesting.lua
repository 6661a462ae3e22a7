-- Input too deep for a careless decoder fails its own call, and the next
-- call on the same worker (the same wasm instance) is served.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(env.testing)
assert(ok, conn)

local function show(name, ok, err, info)
    ngx.say(name, ": ", tostring(ok), " | ", tostring(err), " | ", info and info.code or "-")
end

for _, depth in ipairs({101, 5000, 20000}) do
    local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Nest", {depth = depth})
    show("reply " .. depth, ok, err, info)
end
local ok, err, info = conn:unary("/grpcwasm.testing.Testing/Nest", {depth = 20000, inDetails = true})
show("details", ok, err, info)
ngx.say("detail: ", info.details[1]["@type"], " ", #info.details[1].value > 100000)
local ok, res = conn:unary("/grpcwasm.testing.Testing/Nest", {depth = 2})
ngx.say("after: ", tostring(ok), " ", res.value["@type"], " ", res.value.value["@type"])

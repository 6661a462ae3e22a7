-- API misuse returns false, err (never a raised Lua error), and a TLS
-- option that is present but unusable fails connect instead of going
-- plaintext.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/helloworld.proto"))

local function show(name, ok, err)
    ngx.say(name, ": ", tostring(ok), " | ", tostring(err))
end

show("readfile missing", grpc.readfile(env.protos .. "/missing.pem"))
local read_ok, text = grpc.readfile(env.protos .. "/helloworld.proto")
show("readfile", read_ok, #text == #io.open(env.protos .. "/helloworld.proto"):read("*a"))
show("ca from a failed readfile", grpc.connect(env.greeter, { ca = grpc.readfile(env.protos .. "/missing.pem") }))
show("ca as readfile's first value",
     grpc.connect(env.greeter, { ca = grpc.readfile(env.protos .. "/helloworld.proto") }))
show("ca a number", grpc.connect(env.greeter, { ca = 42 }))
show("host empty", grpc.connect(env.greeter, { host = "" }))
show("opts a string", grpc.connect(env.greeter, "tls"))
show("init opts a string", grpc.init("x"))
show("json options a string", grpc.set_json_options("x"))
show("include a string", grpc.loadfile(env.protos .. "/helloworld.proto", { include = "x" }))
local _, conn = grpc.connect(env.greeter)
show("call opts a number", conn:unary("/helloworld.Greeter/SayHello", { name = "x" }, 5))
show("timeout a string", conn:unary("/helloworld.Greeter/SayHello", { name = "x" }, { timeout = "100" }))
show("timeout negative", conn:unary("/helloworld.Greeter/SayHello", { name = "x" }, { timeout = -1 }))
show("stream opts a string", conn:new_stream("/helloworld.Greeter/SayHello", "x"))
local ok, res = conn:unary("/helloworld.Greeter/SayHello", { name = "still" }, { timeout = 5000 })
ngx.say("then: ", tostring(ok), " ", ok and res.message or tostring(res))

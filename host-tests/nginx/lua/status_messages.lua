-- Status messages as the server sent them, byte for byte: each line is
-- "<n>: " and the message of info (the call's status), as a Lua %q string.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(env.testing)
assert(ok, conn)
local messages = {
    "\t\ntest with whitespace\r\nand Unicode BMP \226\152\186 and non-BMP \240\159\152\136\t\n",
    'cannot parse {"a": 1}',
    "100% done, {nested {braces}} and trailing spaces   ",
}
for i, message in ipairs(messages) do
    local _, _, info = conn:unary("/grpcwasm.testing.Testing/Fail", { code = 2, message = message })
    ngx.say(i, ": ", info and info.message == message and "same" or string.format("%q", info and info.message))
end

-- Metadata that would smuggle entries (NUL, CR/LF), and any value that is
-- not printable ASCII, is refused; -bin values carry any bytes.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local _, conn = grpc.connect(env.testing)

local function try(name, metadata)
    local ok, res, info = conn:unary("/grpcwasm.testing.Testing/EchoMetadata", {},
                                     { metadata = metadata, timeout = 5000 })
    if not ok then
        ngx.say(name, ": false ", res)
        return
    end
    -- -bin values come back as the raw bytes sent, headers and trailers
    -- alike (gRPC carries them as base64).
    local raw = info.headers["x-echo-raw-bin"]
    local trailer = info.trailers["x-echo-raw-trailer-bin"]
    ngx.say(name, ": true authorization=", tostring(res.metadata.authorization), " a=", tostring(res.metadata.a),
            " bin=", raw == "a\0authorization\0b\r\n" and "intact" or tostring(raw),
            " trailer=", trailer == "a\0authorization\0b\r\n" and "intact" or tostring(trailer))
end

try("nul in value", { a = "x\0authorization\0Bearer x" })
try("crlf in value", { a = "x\r\nauthorization: Bearer x" })
try("nul in key", { ["a\0authorization"] = "Bearer x" })
try("utf-8 in value", { a = "caf\195\169" })
try("del in value", { a = "x\127" })
try("not a table", "a=b")
try("bin", { ["x-echo-raw-bin"] = "a\0authorization\0b\r\n" })
try("plain", { a = "fine" })

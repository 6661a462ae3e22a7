-- A panic in the shim while a stream is open on a cosocket connection
-- (the shim's test hook): the connection is closed, the stream fails,
-- and the worker serves on.
local ffi = require("ffi")
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
pcall(ffi.cdef, "int32_t grpc_wasm_test_panic(void);")
local shim = ffi.load(os.getenv("GRPC_WASM_SHIM"))

local ok, conn = grpc.connect(env.testing, {transport = "cosocket"})
assert(ok, conn)
local stream
ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail")
assert(ok, stream)
-- The server sends one item, then nothing for 20 s: only the pump
-- would run meanwhile.
assert(stream:send({count = 2, intervalMillis = 20000}))
assert(stream:close_send())
assert(stream:recv())
local rc = shim.grpc_wasm_test_panic()
-- The pump's writer looks again at its next keepalive tick (1 s at most).
ngx.sleep(1.5)
local item
ok, item = stream:recv()
ngx.say(rc, " | ", tostring(ok), " | ", tostring(item))
stream:close()

-- A stream read to its end (DEADLINE_EXCEEDED) and kept, never closed: a
-- caller may hold its streams in a table. It must not keep the worker from
-- exiting at a graceful stop.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")

assert(grpc.loadfile(env.protos .. "/testing.proto"))
local ok, conn = grpc.connect(env.testing)
assert(ok, conn)
local sok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail", { timeout = 1 })
assert(sok, stream)
stream:send({ count = 2, interval_millis = 10000 })
local rok, err, info = stream:recv()
package.loaded.kept_stream = stream
ngx.say(tostring(rok), " ", info and info.code or tostring(err))

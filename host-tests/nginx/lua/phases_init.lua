-- init_by_lua: settings are recorded, nothing is set up in the master.
local grpc = require("resty.ffi.grpc")
local env = require("testenv")
local ok, err = grpc.init({ timeout = 5000 })
PHASE_INIT = tostring(ok) .. " " .. tostring(err) -- luacheck: ignore (read by the test's handler)
local lok, lerr = grpc.loadfile(env.protos .. "/helloworld.proto")
PHASE_LOAD = tostring(lok) .. " " .. tostring(lerr) -- luacheck: ignore

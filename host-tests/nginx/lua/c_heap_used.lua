-- This worker's C heap in use (kB, glibc's mallinfo2), after a full
-- collection has freed what LuaJIT no longer holds.
collectgarbage()
local used = require("c_heap").kb()
ngx.say(used)

-- Logs this worker's memory at most every 10 s, for the soak to set beside
-- RSS: the Lua heap (collectgarbage("count")) and the C heap (c_heap.lua),
-- so that growth can be told LuaJIT's, a leak, or fragmentation. Not a
-- handler.
local c_heap = require("c_heap")

local _M = {}

local EVERY = 10
local last = 0

function _M.maybe_log()
    local now = ngx.now()
    if now - last < EVERY then
        return
    end
    last = now
    local used, free, mmapped = c_heap.kb()
    ngx.log(ngx.WARN, "soak heap: ", ngx.worker.pid(), " lua ", math.floor(collectgarbage("count")),
            " used ", used, " free ", free, " mmapped ", mmapped, " at ", now)
end

return _M

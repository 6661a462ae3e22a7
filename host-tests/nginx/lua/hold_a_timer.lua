-- Takes one pending timer slot for an hour (test_faults.py fills
-- lua_max_pending_timers with it). Not a handler for anything else.
local ok, err = ngx.timer.at(3600, function() end)
ngx.say(ok and "held" or ("no timer: " .. tostring(err)))

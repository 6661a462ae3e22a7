-- Calls for the fault tests (test_faults.py), on conns this worker keeps by
-- name across requests. ?name=&addr=&transport= pick the conn; then
--   do=sleep&ms=&timeout=&n=     n Testing.Sleep calls one after another
--   do=inflight&n=&ms=&timeout= n Sleep calls in flight at once
--   do=cancels&n=&timeout=       n streams one after another, each closed
--                                once its first message is in
--   do=unclosed&timeout=         a server-streaming call whose request is
--                                never half-closed: it must end at its
--                                deadline
--   do=held&hold=&timeout=       a stream whose first recv ends it (a
--                                refused server) and that its caller
--                                closes only `hold` ms later
-- Each call is counted by its outcome, "ok" or the status name; the answer
-- is "<outcome>=<count> ... | <slowest call in ms> | <first error>", with
-- status 500 when a call failed and the request asked for &strict=1.
local env = require("testenv")
local kept_conns = require("kept_conns")

local args = ngx.req.get_uri_args()
local conn, err = kept_conns.get(args, env.protos .. "/testing.proto")
if not conn then
    ngx.say("connect failed | 0 | ", err)
    return
end

local counts, slowest, first_error = {}, 0, nil

-- Runs call() (ok, res, info as a call returns them) and counts its
-- outcome, "ok" or the status name, and its time.
local function timed(call)
    -- The tests' marker that a call is on its way (nginx_harness.wait_for_log);
    -- the ";" ends the name, so that one name's marker is no other's prefix.
    ngx.log(ngx.INFO, "faults call start ", args.name, ";")
    ngx.update_time()
    local started = ngx.now()
    local ok, res, info = call()
    ngx.update_time()
    slowest = math.max(slowest, math.floor((ngx.now() - started) * 1000 + 0.5))
    local outcome = ok and "ok" or (info and info.name or "FAILED")
    counts[outcome] = (counts[outcome] or 0) + 1
    if not ok then
        first_error = first_error or tostring(res)
    end
end

local function one()
    timed(function()
        return conn:unary("/grpcwasm.testing.Testing/Sleep", { millis = tonumber(args.ms) or 0 },
                          { timeout = tonumber(args.timeout) })
    end)
end

-- A StreamThenFail stream's first message; `half_close` false leaves the
-- request open, and the call starts only once it ends, which never comes.
-- The stream is closed after its first message (cancelled if it runs).
local function first_of_stream(half_close, hold_ms)
    timed(function()
        local ok, stream = conn:new_stream("/grpcwasm.testing.Testing/StreamThenFail",
                                           { timeout = tonumber(args.timeout) })
        if not ok then
            return false, stream
        end
        stream:send({ count = 1 })
        if half_close then
            stream:close_send()
        end
        local rok, res, info = stream:recv()
        if hold_ms then
            ngx.sleep(hold_ms / 1000)
        end
        stream:close()
        return rok and res ~= nil, res, info
    end)
end

if args["do"] == "unclosed" then
    first_of_stream(false)
elseif args["do"] == "held" then
    first_of_stream(true, tonumber(args.hold))
elseif args["do"] == "cancels" then
    for _ = 1, tonumber(args.n) do
        first_of_stream(true)
    end
elseif args["do"] == "inflight" then
    local threads = {}
    for i = 1, tonumber(args.n) do
        threads[i] = ngx.thread.spawn(one)
    end
    for i = 1, #threads do
        ngx.thread.wait(threads[i])
    end
else
    for _ = 1, tonumber(args.n) or 1 do
        one()
    end
end

if args.strict and counts.ok ~= (tonumber(args.n) or 1) then
    ngx.status = 500
end
local names = {}
for name in pairs(counts) do
    names[#names + 1] = name
end
table.sort(names)
for i, name in ipairs(names) do
    names[i] = name .. "=" .. counts[name]
end
ngx.say(table.concat(names, " "), " | ", slowest, " | ", first_error or "")

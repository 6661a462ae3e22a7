-- One call of the soak's mix (host-tests/soak.py), picked by ?kind=, on
-- conns this worker keeps by name (?transport= picks the transport).
-- Answers 200 and the outcome when the call ended as that kind intends
-- (a success, or the failure it provokes), else 500 and what happened.
local env = require("testenv")
local kept_conns = require("kept_conns")
local soak_heap = require("soak_heap")

local args = ngx.req.get_uri_args()
local transport = args.transport or "cosocket"

local function conn_to(name, addr, proto)
    return kept_conns.get({ name = name .. "-" .. transport, addr = addr, transport = transport },
                          env.protos .. "/" .. proto)
end

-- Reads a stream to its end: ok, count | false, err, info.
local function drain(stream)
    local n = 0
    while true do
        local ok, message, info = stream:recv()
        if not ok then
            return false, message, info
        end
        if message == nil then
            return true, n
        end
        n = n + 1
    end
end

local STREAM_OPTS = { timeout = 5000 }

-- Each kind returns the outcome's name, whether it is the intended one, and
-- what the call returned (an error's text).
local kinds = {}

function kinds.unary(testing)
    local ok, res, info = testing:unary("/grpcwasm.testing.Testing/Sleep", { millis = 0 }, { timeout = 5000 })
    return ok and "ok" or info and info.name or res, ok, res
end

function kinds.server_stream(_, routes)
    local ok, stream = routes:new_stream("/routeguide.RouteGuide/ListFeatures", STREAM_OPTS)
    if not ok then
        return stream, false
    end
    stream:send({ lo = { latitude = 400000000, longitude = -750000000 },
                  hi = { latitude = 420000000, longitude = -730000000 } })
    stream:close_send()
    local dok, n, info = drain(stream)
    stream:close()
    return dok and "ok" or info and info.name or n, dok and n > 0, n
end

function kinds.client_stream(_, routes)
    local ok, stream = routes:new_stream("/routeguide.RouteGuide/RecordRoute", STREAM_OPTS)
    if not ok then
        return stream, false
    end
    for i = 1, 5 do
        stream:send({ latitude = 400000000 + i, longitude = -740000000 })
    end
    stream:close_send()
    local rok, summary, info = stream:recv()
    local _, last = stream:recv()
    stream:close()
    return rok and "ok" or info and info.name or summary, rok and summary.pointCount == 5 and last == nil, summary
end

function kinds.bidi(_, routes)
    local ok, stream = routes:new_stream("/routeguide.RouteGuide/RouteChat", STREAM_OPTS)
    if not ok then
        return stream, false
    end
    for i = 1, 3 do
        stream:send({ location = { latitude = i, longitude = i }, message = "soak " .. i })
    end
    stream:close_send()
    local dok, n, info = drain(stream)
    stream:close()
    return dok and "ok" or info and info.name or n, dok, n
end

function kinds.error(testing)
    local ok, res, info = testing:unary("/grpcwasm.testing.Testing/Fail",
                                        { code = 5, message = "soak", with_details = true }, { timeout = 5000 })
    if ok or not info then
        return ok and "ok" or res, false, res
    end
    return info.name, info.code == 5 and info.message == "soak" and #info.details == 2
end

function kinds.deadline(testing)
    local ok, res, info = testing:unary("/grpcwasm.testing.Testing/Sleep", { millis = 1000 }, { timeout = 50 })
    return ok and "ok" or info and info.name or res, not ok and info and info.code == 4, res
end

function kinds.early_close(testing)
    local ok, stream = testing:new_stream("/grpcwasm.testing.Testing/StreamThenFail", STREAM_OPTS)
    if not ok then
        return stream, false
    end
    stream:send({ count = 1000, intervalMillis = 10 })
    stream:close_send()
    local rok, item, info = stream:recv()
    stream:close()
    return rok and "ok" or info and info.name or item, rok and item ~= nil, item
end

-- The server under this conn restarts every 30 s: UNAVAILABLE is intended.
function kinds.restart(_, _, restarting)
    local ok, res, info = restarting:unary("/grpcwasm.testing.Testing/Sleep", { millis = 0 }, { timeout = 2000 })
    local outcome = ok and "ok" or info and info.name or res
    return outcome, outcome == "ok" or outcome == "UNAVAILABLE", res
end

local kind = kinds[args.kind]
if not kind then
    ngx.status = 400
    ngx.say("unknown kind ", tostring(args.kind))
    return
end
local testing, terr = conn_to("testing", args.testing, "testing.proto")
local routes, rerr = conn_to("routes", args.routes, "route_guide.proto")
local restarting, serr = conn_to("restarting", args.restarting, "testing.proto")
if not (testing and routes and restarting) then
    ngx.status = 500
    ngx.say("connect failed: ", terr or rerr or serr)
    return
end
local outcome, intended, detail = kind(testing, routes, restarting)
soak_heap.maybe_log()
if not intended then
    ngx.status = 500
    ngx.log(ngx.WARN, "soak unintended: ", args.kind, "-", transport, ": ", tostring(outcome), " ", tostring(detail))
end
ngx.say(tostring(outcome))

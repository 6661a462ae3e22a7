-- resty.ffi.grpc.metrics: the module's metrics as Lua tables, and in
-- Prometheus' text format for all the workers of an nginx.
--
-- The shim keeps the metrics of its worker and hands them over as text,
-- one metric a line, fields between tabs (lua-shim/src/host/metrics.rs):
--   c|g <tab> name <tab> value
--   h <tab> name <tab> count <tab> sum <tab> cumulative counts, comma separated
-- A name carries its labels as ";label=value" segments after the metric's
-- own name (the filter's convention, which Envoy's stats_tags read too).
-- Each worker adds what it counted to totals in the lua_shared_dict the
-- user names, and sets its gauges there (see publish); a scrape prints the
-- dict.

local ngx = ngx
local tonumber, tostring, ipairs, type = tonumber, tostring, ipairs, type
local concat, sort = table.concat, table.sort
local gmatch, gsub, format, find, sub = string.gmatch, string.gsub, string.format, string.find, string.sub

local _M = {}

-- The histograms' bucket bounds as the shim keeps them (milliseconds:
-- lua-shim/src/host/metrics.rs BUCKETS).
_M.BUCKETS_MS = { 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000 }

local KINDS = { c = "counter", g = "gauge", h = "histogram" }

-- "name;a=1;b=2" -> "name", { a = "1", b = "2" }, { "a", "b" } (label order)
local function split_name(full)
    local at = find(full, ";", 1, true)
    if not at then
        return full, {}, {}
    end
    local labels, order = {}, {}
    for key, value in gmatch(sub(full, at), ";([^;=]+)=([^;]*)") do
        labels[key] = value
        order[#order + 1] = key
    end
    return sub(full, 1, at - 1), labels, order
end

local function split_tabs(line)
    local fields = {}
    for field in gmatch(line, "[^\t]+") do
        fields[#fields + 1] = field
    end
    return fields
end

--- The shim's text as a list of entries: { name, labels, kind, value } or,
-- for a histogram, { name, labels, kind, count, sum (in the unit recorded),
-- buckets = { { le = bound, count = cumulative }, ... } }.
function _M.parse(text)
    local entries = {}
    for line in gmatch(text, "[^\n]+") do
        local f = split_tabs(line)
        local kind = KINDS[f[1]]
        if kind and f[2] then
            local name, labels, order = split_name(f[2])
            local entry = { name = name, labels = labels, label_order = order, kind = kind, series = f[2] }
            if kind == "histogram" then
                entry.count, entry.sum = tonumber(f[3]) or 0, tonumber(f[4]) or 0
                local buckets, i = {}, 0
                for n in gmatch(f[5] or "", "[^,]+") do
                    i = i + 1
                    buckets[i] = { le = _M.BUCKETS_MS[i], count = tonumber(n) or 0 }
                end
                entry.buckets = buckets
            else
                entry.value = tonumber(f[3]) or 0
            end
            entries[#entries + 1] = entry
        end
    end
    return entries
end

local function escape(value)
    return (gsub(gsub(gsub(value, "\\", "\\\\"), "\n", "\\n"), '"', '\\"'))
end

local function label_text(labels, order, extra_key, extra_value)
    local parts = {}
    for _, key in ipairs(order) do
        parts[#parts + 1] = key .. '="' .. escape(labels[key]) .. '"'
    end
    if extra_key then
        parts[#parts + 1] = extra_key .. '="' .. escape(extra_value) .. '"'
    end
    if #parts == 0 then
        return ""
    end
    return "{" .. concat(parts, ",") .. "}"
end

-- A number as Prometheus prints it: integers without a fraction.
local function number(n)
    if n == math.floor(n) and n > -1e15 and n < 1e15 then
        return format("%d", n)
    end
    return format("%.15g", n)
end

-- A histogram in milliseconds is printed in seconds, Prometheus' base
-- unit, under the name users chart (grpc_client_handling_seconds).
local function in_seconds(name)
    local base = name:match("^(.*)_milliseconds$")
    if base then
        return base .. "_seconds", 1000
    end
    return name, 1
end

-- The dict's keys, fields between tabs (a name holds none):
--   c <tab> series                  a counter, all workers' together
--   h <tab> series <tab> count|sum|i  a histogram's count, sum and i-th
--                                     cumulative bucket, all workers'
--   g <tab> worker <tab> series     a gauge, each worker's own
-- Counters and histograms are added to (incr) by what each worker counted
-- since it last published, so that a worker that is replaced (a crash, a
-- reload) takes nothing away from the totals: Prometheus would read a
-- smaller total as a counter reset.

local function family_of(families, names, name, kind)
    local family = families[name]
    if not family then
        family = { kind = kind, series = {}, order = {} }
        families[name] = family
        names[#names + 1] = name
    end
    return family
end

local function series_of(family, key, full)
    local s = family.series[key]
    if not s then
        local _, labels, order = split_name(full)
        s = { labels = labels, label_order = order, value = 0, count = 0, sum = 0, buckets = {} }
        family.series[key] = s
        family.order[#family.order + 1] = key
    end
    return s
end

-- The dict's entries as families of series.
local function gather(dict)
    local families, names = {}, {}
    for _, key in ipairs(dict:get_keys(0)) do
        local value = dict:get(key)
        local kind, a, b = key:match("^(%a)\t([^\t]*)\t?([^\t]*)$")
        if kind == "c" and value then
            local s = series_of(family_of(families, names, split_name(a), "counter"), a, a)
            s.value = value
        elseif kind == "h" and value then
            local s = series_of(family_of(families, names, split_name(a), "histogram"), a, a)
            if b == "count" then
                s.count = value
            elseif b == "sum" then
                s.sum = value
            elseif tonumber(b) then
                s.buckets[tonumber(b)] = value
            end
        elseif kind == "g" and value then
            local s = series_of(family_of(families, names, split_name(b), "gauge"), a .. "\t" .. b, b)
            s.value, s.worker = value, a
        end
    end
    return families, names
end

--- Every worker's metrics in the dict as Prometheus' text format.
function _M.exposition(dict)
    local families, names = gather(dict)
    sort(names)
    local out = {}
    for _, name in ipairs(names) do
        local family = families[name]
        local shown, scale = name, 1
        if family.kind == "histogram" then
            shown, scale = in_seconds(name)
        end
        out[#out + 1] = "# TYPE " .. shown .. " " .. family.kind
        sort(family.order)
        for _, key in ipairs(family.order) do
            local s = family.series[key]
            if family.kind == "histogram" then
                for i, bound in ipairs(_M.BUCKETS_MS) do
                    local le = number(bound / scale)
                    out[#out + 1] = shown .. "_bucket" .. label_text(s.labels, s.label_order, "le", le)
                        .. " " .. number(s.buckets[i] or 0)
                end
                out[#out + 1] = shown .. "_bucket" .. label_text(s.labels, s.label_order, "le", "+Inf")
                    .. " " .. number(s.count)
                out[#out + 1] = shown .. "_sum" .. label_text(s.labels, s.label_order) .. " "
                    .. number(s.sum / scale)
                out[#out + 1] = shown .. "_count" .. label_text(s.labels, s.label_order) .. " "
                    .. number(s.count)
            elseif s.worker then
                out[#out + 1] = shown .. label_text(s.labels, s.label_order, "worker", s.worker)
                    .. " " .. number(s.value)
            else
                out[#out + 1] = shown .. label_text(s.labels, s.label_order) .. " " .. number(s.value)
            end
        end
    end
    out[#out + 1] = ""
    return concat(out, "\n")
end

local function dict_named(name)
    if type(name) ~= "string" or name == "" then
        return nil, "grpc.prometheus needs the name of a lua_shared_dict: grpc.init{metrics_dict = \"grpc_metrics\"}"
            .. " and, in nginx.conf's http block, lua_shared_dict grpc_metrics 1m;"
    end
    local dict = ngx.shared[name]
    if not dict then
        return nil, "lua_shared_dict " .. name .. " is not defined: add `lua_shared_dict " .. name
            .. " 1m;` to nginx.conf's http block"
    end
    return dict
end

-- What this worker last published, by key: the next publish adds only
-- the difference.
local last = {}

local function full(dict_name, err)
    return "cannot publish the metrics in lua_shared_dict " .. dict_name .. ": " .. tostring(err)
        .. " (give it more room, and no other use)"
end

-- Adds to a total what this worker counted since it last did.
local function add(dict, dict_name, key, value)
    local delta = value - (last[key] or 0)
    if delta < 0 then
        -- This worker's own count started again (it cannot go down).
        delta = value
    end
    if delta ~= 0 then
        local _, err, forcible = dict:incr(key, delta, 0)
        if err then
            return nil, full(dict_name, err)
        end
        if forcible then
            return nil, full(dict_name, "it was full, and older entries were dropped")
        end
    end
    last[key] = value
    return true
end

local function set(dict, dict_name, key, value)
    if last[key] == value then
        return true
    end
    local ok, err, forcible = dict:set(key, value)
    if not ok then
        return nil, full(dict_name, err)
    end
    if forcible then
        return nil, full(dict_name, "it was full, and older entries were dropped")
    end
    last[key] = value
    return true
end

-- This worker's name among the workers (a privileged agent has no id).
local function worker_name()
    local id = ngx.worker.id()
    return id and tostring(id) or ("pid" .. ngx.worker.pid())
end

--- Adds this worker's counts since its last publish to the dict's totals,
-- and sets its gauges. Returns true, or nil and the first error.
function _M.publish(dict_name, text)
    local dict, err = dict_named(dict_name)
    if not dict then
        return nil, err
    end
    local worker = worker_name()
    local first
    local function keep(ok, why)
        if not ok and not first then
            first = why
        end
    end
    for _, e in ipairs(_M.parse(text)) do
        if e.kind == "counter" then
            keep(add(dict, dict_name, "c\t" .. e.series, e.value))
        elseif e.kind == "gauge" then
            keep(set(dict, dict_name, "g\t" .. worker .. "\t" .. e.series, e.value))
        else
            local prefix = "h\t" .. e.series .. "\t"
            keep(add(dict, dict_name, prefix .. "count", e.count))
            keep(add(dict, dict_name, prefix .. "sum", e.sum))
            for i, b in ipairs(e.buckets) do
                keep(add(dict, dict_name, prefix .. i, b.count))
            end
        end
    end
    if first then
        return nil, first
    end
    return true
end

--- The dict a name names, or nil and what to add to nginx.conf.
_M.dict_named = dict_named

--- Checks the dict's name without touching it.
_M.check_dict = dict_named

return _M

-- resty.ffi.grpc.metrics: the module's metrics as Lua tables, and in
-- Prometheus' text format for all the workers of an nginx.
--
-- The shim keeps the metrics of its worker and hands them over as text,
-- one metric a line, fields between tabs (lua-shim/src/host/metrics.rs):
--   c|g <tab> name <tab> value
--   h <tab> name <tab> count <tab> sum <tab> cumulative counts, comma separated
-- A name carries its labels as ";label=value" segments after the metric's
-- own name (the filter's convention, which Envoy's stats_tags read too).
-- Each worker publishes its text in the lua_shared_dict the user names;
-- a scrape adds the workers' counters and histograms up and labels each
-- worker's gauges with its id.

local ngx = ngx
local tonumber, tostring, ipairs, pairs, type = tonumber, tostring, ipairs, pairs, type
local concat, sort = table.concat, table.sort
local gmatch, gsub, format, find, sub = string.gmatch, string.gsub, string.format, string.find, string.sub

local _M = {}

-- The histograms' bucket bounds as the shim keeps them (milliseconds:
-- lua-shim/src/host/metrics.rs BUCKETS).
_M.BUCKETS_MS = { 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000 }

local KINDS = { c = "counter", g = "gauge", h = "histogram" }
local PREFIX = "grpc-wasm-metrics:" -- the dict's keys: PREFIX .. worker id

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

--- The workers' texts ({ [worker id] = text }) as Prometheus' text format.
function _M.exposition(texts)
    local families, names = {}, {}
    local workers = {}
    for worker in pairs(texts) do
        workers[#workers + 1] = worker
    end
    sort(workers)
    for _, worker in ipairs(workers) do
        for _, e in ipairs(_M.parse(texts[worker])) do
            local family = families[e.name]
            if not family then
                family = { kind = e.kind, series = {}, order = {} }
                families[e.name] = family
                names[#names + 1] = e.name
            end
            -- Gauges are each worker's own; the rest add up.
            local key = e.kind == "gauge" and (e.series .. "\0" .. worker) or e.series
            local s = family.series[key]
            if not s then
                s = { labels = e.labels, label_order = e.label_order, value = 0, count = 0, sum = 0,
                      buckets = {}, worker = e.kind == "gauge" and worker or nil }
                family.series[key] = s
                family.order[#family.order + 1] = key
            end
            if e.kind == "histogram" then
                s.count, s.sum = s.count + e.count, s.sum + e.sum
                for i, b in ipairs(e.buckets) do
                    s.buckets[i] = (s.buckets[i] or 0) + b.count
                end
            else
                s.value = s.value + e.value
            end
        end
    end
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
                for i, count in ipairs(s.buckets) do
                    local le = number(_M.BUCKETS_MS[i] / scale)
                    out[#out + 1] = shown .. "_bucket" .. label_text(s.labels, s.label_order, "le", le)
                        .. " " .. number(count)
                end
                out[#out + 1] = shown .. "_bucket" .. label_text(s.labels, s.label_order, "le", "+Inf")
                    .. " " .. number(s.count)
                out[#out + 1] = shown .. "_sum" .. label_text(s.labels, s.label_order) .. " "
                    .. number(s.sum / scale)
                out[#out + 1] = shown .. "_count" .. label_text(s.labels, s.label_order) .. " "
                    .. number(s.count)
            elseif s.worker then
                out[#out + 1] = shown .. label_text(s.labels, s.label_order, "worker", tostring(s.worker))
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

local published -- this worker's last text in the dict

--- Writes this worker's text into the dict (when it changed).
function _M.publish(dict_name, text)
    local dict, err = dict_named(dict_name)
    if not dict then
        return nil, err
    end
    if text == published then
        return true
    end
    local ok, serr = dict:set(PREFIX .. tostring(ngx.worker.id() or 0), text)
    if not ok then
        return nil, "cannot publish the metrics in lua_shared_dict " .. dict_name .. ": " .. tostring(serr)
    end
    published = text
    return true
end

--- Every worker's text in the dict, by worker id.
function _M.collect(dict_name)
    local dict, err = dict_named(dict_name)
    if not dict then
        return nil, err
    end
    local texts = {}
    for worker = 0, ngx.worker.count() - 1 do
        local text = dict:get(PREFIX .. worker)
        if text then
            texts[worker] = text
        end
    end
    return texts
end

--- Checks the dict's name without touching it.
_M.check_dict = dict_named

return _M

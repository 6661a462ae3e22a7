-- resty.ffi.grpc.shim: where the native side is and what it was told. The
-- settings grpc.init records, how the shim (liblua_shim.so) and the module
-- (grpc_wasm.wasm) are found, and the shim's C declarations: what both
-- backends share, so that they find and configure the native side alike.
local ffi = require("ffi")

local tostring, pairs = tostring, pairs
local concat = table.concat

-- The project's version: liblua_shim.so and grpc_wasm.wasm must be of the
-- same release (the backends check the shim; the shim checks the module).
local _M = { VERSION = "0.1.0" }

-- The shim's C ABI as lua-shim/include/grpc_wasm.h declares it (cbindgen,
-- from src/ffi.rs); lua-shim/tests/c_header.rs fails when they differ.
ffi.cdef [[
typedef struct {
    const char *addr;
    const char *host;
    const char *ca;
    const char *cert;
    const char *key;
    int64_t keepalive_ms;
    int64_t keepalive_timeout_ms;
    int64_t handshake_timeout_ms;
} grpc_wasm_connect_options;

typedef struct {
    int32_t kind;
    int32_t http_status;
    const char *body;
    size_t body_len;
    const char *headers;
    size_t headers_len;
    int32_t code;
    int32_t resumed;
} grpc_wasm_event;

const char *grpc_wasm_version(void);
const char *grpc_wasm_last_error(void);
int32_t grpc_wasm_init(const char *module_path, const char *cache_dir, const char *socket_dir);
const char *grpc_wasm_socket_path(void);
int32_t grpc_wasm_ready(uint32_t *out, int32_t max);
int32_t grpc_wasm_loadfile(const char *path, const char *include);
int32_t grpc_wasm_load_descriptor_set(const char *data, size_t len);
int32_t grpc_wasm_set_print_options(const char *json, size_t len);
int32_t grpc_wasm_set_max_queued_bytes(int64_t bytes);
int32_t grpc_wasm_connect(const grpc_wasm_connect_options *options);
int32_t grpc_wasm_wire_connect(const grpc_wasm_connect_options *options);
int32_t grpc_wasm_wire_input(uint32_t conn, const char *data, size_t len, uint32_t *out, int32_t max);
int32_t grpc_wasm_wire_pending(uint32_t conn);
int32_t grpc_wasm_reflect(uint32_t conn, const char *services, size_t services_len, int64_t timeout_ms);
const char *grpc_wasm_reflected(uint32_t id, size_t *len);
const char *grpc_wasm_describe(const char *name, size_t name_len, size_t *len);
const char *grpc_wasm_openapi(const char *options, size_t options_len, size_t *len);
const char *grpc_wasm_metrics(size_t *len);
const char *grpc_wasm_wire_output(uint32_t conn, size_t *len);
int32_t grpc_wasm_wire_reset(uint32_t conn, const char *reason, uint32_t *out, int32_t max);
int32_t grpc_wasm_wire_tick(uint32_t conn, uint32_t *out, int32_t max, int64_t *next_ms);
void grpc_wasm_conn_close(uint32_t conn);
int32_t grpc_wasm_check_propagate(const char *name, size_t len);
int32_t grpc_wasm_start(uint32_t conn, const char *path, size_t path_len, const char *body, size_t body_len,
                        int64_t timeout_ms, const char *metadata, size_t metadata_len, const char *propagated,
                        size_t propagated_len, const char *json_options, const char *compression);
int32_t grpc_wasm_send(uint32_t id, const char *json, size_t len, int32_t compress);
int64_t grpc_wasm_send_backlog(uint32_t id);
int32_t grpc_wasm_close_send(uint32_t id);
int32_t grpc_wasm_next_event(uint32_t id, grpc_wasm_event *out);
void grpc_wasm_close(uint32_t id);
]]


-- What grpc.init recorded (its opts), read by the backends at their init
-- and by each connect.
local settings = {}
_M.settings = settings

local function dirname(path)
    return path:match("^(.*)/[^/]*$") or "."
end

-- The first readable file among patterns such as package.cpath's.
local function search(patterns, name)
    for pattern in patterns:gmatch("[^;]+") do
        local path = pattern:gsub("%?", name)
        local f = io.open(path, "rb")
        if f then
            f:close()
            return path
        end
    end
    return nil
end

-- An environment variable, "" counting as unset (nginx's `env NAME=;`).
local function getenv(name)
    local v = os.getenv(name)
    if v == "" then
        return nil
    end
    return v
end

local function find_shim()
    local path = settings.shim or getenv("GRPC_WASM_SHIM") or search(package.cpath, "liblua_shim")
    if not path then
        return nil, "liblua_shim.so not found: set GRPC_WASM_SHIM, grpc.init{shim = path} or package.cpath"
    end
    return path
end

-- The module, sought the same way on both paths; a missing one is named
-- with where it was sought, as the native side could only say "failed".
local function find_module(shim)
    local path, from = settings.module, "grpc.init{module = ...}"
    if not path then
        path, from = getenv("GRPC_WASM_MODULE"), "GRPC_WASM_MODULE"
    end
    if not path then
        path, from = dirname(shim) .. "/grpc_wasm.wasm", "next to the shim " .. shim
    end
    local f, err = io.open(path, "rb")
    if not f then
        return nil, "grpc_wasm.wasm not found: " .. tostring(err) .. " (sought " .. from
            .. "; set grpc.init{module = path} or GRPC_WASM_MODULE)"
    end
    f:close()
    return path
end

-- Keys and values in turn, each as its length, ':' and its bytes: no byte
-- of a value can start an entry of its own, and the native side checks
-- the metadata rule on the values as they are. Both backends send
-- metadata so (lua-resty-ffi's tasks in base64: they are JSON, and a
-- header value need not be UTF-8).
local function flatten_pairs(metadata)
    if not metadata then
        return nil, 0
    end
    local parts = {}
    for k, v in pairs(metadata) do
        parts[#parts + 1] = #k
        parts[#parts + 1] = ":"
        parts[#parts + 1] = k
        parts[#parts + 1] = #v
        parts[#parts + 1] = ":"
        parts[#parts + 1] = v
    end
    local flat = concat(parts)
    return flat, #flat
end

-- Why a request header cannot be named in grpc.init{propagate}, by the
-- core's rule (the shim's, as the filter's callout.propagate); nil when it
-- can. `shim` is where grpc.init is told the shim is, if it is. The rule
-- needs no worker: the shim is loaded where init runs, the master too.
local checker
local function check_propagated(name, shim)
    if not checker then
        local path, err = shim, nil
        if not path then
            path, err = find_shim()
        end
        if not path then
            return err
        end
        local ok, lib = pcall(ffi.load, path)
        if not ok then
            return "cannot load " .. path .. ": " .. tostring(lib)
        end
        checker = lib
    end
    local ok, rc = pcall(function() return checker.grpc_wasm_check_propagate(name, #name) end)
    if not ok then
        return "the shim cannot check header names (" .. tostring(rc) .. "): install it from this release"
    end
    if rc ~= 0 then
        return ffi.string(checker.grpc_wasm_last_error())
    end
    return nil
end

-- A shim of this release's version but an older build, from before
-- grpc_wasm_start took the propagated headers (its calls would read their
-- arguments wrongly): nil, or why it is refused.
local function older_build(lib, shim)
    if pcall(function() return lib.grpc_wasm_check_propagate end) then
        return nil
    end
    return shim .. " is an older build of " .. _M.VERSION .. " (it has no grpc_wasm_check_propagate):"
        .. " install liblua_shim.so and resty.ffi.grpc from the same build"
end

-- The compiled-module cache: nil lets the shim pick its private default
-- directory; false (or "") disables the cache.
local function cache_dir()
    local dir = settings.cache_dir
    if dir == nil then
        dir = os.getenv("GRPC_WASM_CACHE_DIR")
    end
    if dir == false then
        return ""
    end
    return dir
end

-- A connection's keepalive interval and timeout and handshake timeout
-- (ms): from connect's opts, else grpc.init's, else 0 (the shim's default).
local function keepalive_of(opts)
    local function ms(key)
        return opts[key] or settings[key] or 0
    end
    return ms("keepalive_interval"), ms("keepalive_timeout"), ms("handshake_timeout")
end

_M.getenv = getenv
_M.find_shim = find_shim
_M.find_module = find_module
_M.check_propagated = check_propagated
_M.older_build = older_build
_M.flatten_pairs = flatten_pairs
_M.cache_dir = cache_dir
_M.keepalive_of = keepalive_of

return _M

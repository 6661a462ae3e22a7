-- A stand-in for lua-resty-ffi's Lua side (ngx.load_ffi and runtime:call),
-- over the C harness that plays its task queue (host-tests/resty-ffi). It
-- lets the nginx tests drive resty.ffi.grpc's lua-resty-ffi path through
-- the exact C ABI. lua-resty-ffi wakes the coroutine with an eventfd; this
-- stand-in polls with ngx.sleep, which is slower but equivalent.
local ffi = require("ffi")
local env = require("testenv")

ffi.cdef [[
void *harness_load(const char *so_path, const char *cfg);
const char *harness_error(void);
void *harness_submit(void *h, const char *req, int len);
int harness_done(void *task);
int harness_wait(void *task, int timeout_ms, int *rc, char **rsp, int *rsp_len);
void harness_free(void *p);
]]

local H = ffi.load(env.resty_ffi_harness, true)

local function call(h, req)
    local t = H.harness_submit(h, req, #req)
    if t == nil then
        return false, -1, ffi.string(H.harness_error())
    end
    while H.harness_done(t) == 0 do
        ngx.sleep(0.001)
    end
    local rc, rsp, len = ffi.new("int[1]"), ffi.new("char*[1]"), ffi.new("int[1]")
    H.harness_wait(t, 0, rc, rsp, len)
    local res
    if rsp[0] ~= nil then
        res = ffi.string(rsp[0], len[0])
        H.harness_free(rsp[0])
    end
    if rc[0] == 0 then
        return true, res
    end
    return false, rc[0], res
end

-- As lua-resty-ffi's: `lib` goes to ffi.load (a path, or a name it
-- searches), which raises when it cannot load it; a failed libffi_init
-- gives nil and its return code.
ngx.load_ffi = function(lib, cfg)
    local h = H.harness_load(lib, cfg)
    if h == nil then
        local err = ffi.string(H.harness_error())
        local rc = err:match("^libffi_init returned (%-?%d+)$")
        if rc then
            return nil, tonumber(rc)
        end
        error(err)
    end
    return setmetatable({}, { __index = function() return function(_, req) return call(h, req) end end })
end

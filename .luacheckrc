-- luacheck (Debian's lua-check), run by `make lint`.
std = "ngx_lua"
-- LuaJIT's bit and ffi libraries are globals in OpenResty's LuaJIT.
read_globals = {
    "bit", "jit",
    -- lua-resty-ffi's `require "resty_ffi"` adds ngx.load_ffi.
    ngx = { fields = { "load_ffi" } },
}
max_line_length = 120

-- The test handlers: one-off request scripts that reuse `ok, res` names and
-- ignore what a step returns when the next step shows it anyway.
files["host-tests"] = { ignore = { "211", "411", "421", "431" } }
-- The stand-in for lua-resty-ffi defines what the real one does.
files["host-tests/nginx/lua/fake_resty_ffi.lua"] = { globals = { ngx = { fields = { "load_ffi" } } } }

-- glibc's view of this worker's C heap (mallinfo2), in kB: bytes in use,
-- bytes free inside the heap, bytes mmapped. LuaJIT's own heap is not in
-- it. Not a handler.
local ffi = require("ffi")

local _M = {}

ffi.cdef([[
struct grpc_test_mallinfo2 {
    size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
struct grpc_test_mallinfo2 mallinfo2(void);
]])

function _M.kb()
    local m = ffi.C.mallinfo2()
    return math.floor(tonumber(m.uordblks) / 1024), math.floor(tonumber(m.fordblks) / 1024),
           math.floor(tonumber(m.hblkhd) / 1024)
end

return _M

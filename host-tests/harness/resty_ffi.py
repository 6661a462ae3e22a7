"""ctypes driver for libresty_ffi_harness.so (see harness.c for the contract).

    h = Harness("/path/libresty_ffi_harness.so")
    rt = h.load("/path/liblua_shim.so", "cfg")   # HarnessError if init fails
    rc, rsp = h.call(rt, b"request")             # rsp: bytes, or None for NULL
    ok, res_or_rc, err = Harness.as_lua(rc, rsp) # what Lua's runtime:call sees
    assert h.shutdown(rt)
    assert h.violations() == 0 and h.poll_after_null() == 0
"""

import ctypes
import os

_P = ctypes.c_void_p
_INT_P = ctypes.POINTER(ctypes.c_int)
_CHAR_PP = ctypes.POINTER(ctypes.POINTER(ctypes.c_char))


class HarnessError(RuntimeError):
    pass


def _bytes(v):
    if v is None or isinstance(v, bytes):
        return v
    return str(v).encode()


class Harness:
    def __init__(self, path):
        # RTLD_GLOBAL so runtimes resolve ngx_http_lua_ffi_* against us.
        lib = ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)
        sigs = {
            "harness_error": (ctypes.c_char_p, []),
            "harness_last_violation": (ctypes.c_char_p, []),
            "harness_free": (None, [_P]),
            "harness_load": (_P, [ctypes.c_char_p, ctypes.c_char_p]),
            "harness_submit": (_P, [_P, ctypes.c_char_p, ctypes.c_int]),
            "harness_wait": (ctypes.c_int, [_P, ctypes.c_int, _INT_P, _CHAR_PP, _INT_P]),
            "harness_shutdown": (ctypes.c_int, [_P]),
            "harness_outstanding": (ctypes.c_int, [_P]),
            "harness_violations": (ctypes.c_int, []),
            "harness_poll_after_null": (ctypes.c_int, []),
            "harness_reset_counters": (None, []),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib

    def _error(self):
        return self.lib.harness_error().decode(errors="replace")

    def load(self, so_path, cfg=None):
        """dlopen + libffi_init; returns the runtime handle (queue pointer)."""
        h = self.lib.harness_load(os.fsencode(so_path), _bytes(cfg))
        if not h:
            raise HarnessError(self._error())
        return h

    def submit(self, h, req):
        """Queue one task (req: bytes/str, or None for a NULL request)."""
        req = _bytes(req)
        t = self.lib.harness_submit(h, req, len(req) if req is not None else 0)
        if not t:
            raise HarnessError(self._error())
        return t

    def wait(self, task, timeout=5.0):
        """(rc, bytes | None); TimeoutError after timeout seconds (None: forever).

        The task is spent either way; a late response is dropped.
        """
        rc, n = ctypes.c_int(), ctypes.c_int()
        buf = ctypes.POINTER(ctypes.c_char)()
        ms = -1 if timeout is None else int(timeout * 1000)
        if self.lib.harness_wait(task, ms, ctypes.byref(rc), ctypes.byref(buf),
                                 ctypes.byref(n)) != 0:
            raise TimeoutError(f"no response within {timeout}s")
        if not buf:
            return rc.value, None
        try:
            return rc.value, ctypes.string_at(buf, n.value)
        finally:
            self.lib.harness_free(buf)

    def call(self, h, req, timeout=5.0):
        return self.wait(self.submit(h, req), timeout)

    def shutdown(self, h):
        """Send the unload marker; True once poll returned NULL (5 s bound)."""
        return self.lib.harness_shutdown(h) == 0

    def outstanding(self, h):
        return self.lib.harness_outstanding(h)

    def violations(self):
        return self.lib.harness_violations()

    def last_violation(self):
        return self.lib.harness_last_violation().decode(errors="replace")

    def poll_after_null(self):
        return self.lib.harness_poll_after_null()

    def reset_counters(self):
        self.lib.harness_reset_counters()

    @staticmethod
    def as_lua(rc, rsp):
        """The values Lua's runtime:call(req) returns for this response."""
        return (True, rsp, None) if rc == 0 else (False, rc, rsp)

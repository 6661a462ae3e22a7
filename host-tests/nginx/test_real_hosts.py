"""Issue 14, section 4: what a new user met in real hosts (Debian's nginx,
the real lua-resty-ffi): the way in that is taken, lua-resty-ffi missing or
misconfigured, and error-level lines for a normal idle connection."""

import os
import subprocess
import time

import pytest

from harness.nginx import Nginx, Server, check_log
from harness.paths import PROTOS, SHIM, WASM

FAKE_RESTY_FFI = 'init_by_lua_block { require("fake_resty_ffi") }'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    greeter = Server("greeter-server")
    out = tmp_path_factory.mktemp("harness")
    subprocess.run(["sh", os.path.join(os.path.dirname(__file__), "..", "resty-ffi", "build.sh"), str(out)],
                   check=True)
    yield {"greeter": greeter.addr, "protos": PROTOS, "resty_ffi_harness": str(out / "libresty_ffi_harness.so")}
    greeter.stop()


def run(env, *paths, **nginx):
    proxy = Nginx(env, workers=1, **nginx)
    try:
        answers = [proxy.get(path) for path in paths]
    finally:
        proxy.stop()
    check_log(proxy)
    return answers, proxy.log()


def test_resty_ffi_mode_without_lua_resty_ffi_is_an_error(env):
    (answer,), log = run(env, "/t/real_hosts?case=init&mode=resty_ffi")
    assert answer == (200, "init: false mode 'resty_ffi' needs lua-resty-ffi: ngx.load_ffi is not defined; "
                           "run require \"resty_ffi\" first (e.g. in init_by_lua_block), with libresty_ffi.so "
                           "where LuaJIT's ffi.load finds it mode: nil\n"), log[-3000:]


def test_with_lua_resty_ffi_loaded_calls_still_take_the_ffi_path(env):
    # The cosocket transport, unless resty_ffi is asked for.
    answers, log = run(env, "/t/real_hosts?case=init", "/t/real_hosts?case=init&mode=resty_ffi",
                       http_extra=FAKE_RESTY_FFI)
    assert answers[0] == (200, "init: true nil mode: ffi\nunary: true Hello host!\n"), log[-3000:]
    # Once a worker has its way in, it keeps it.
    assert answers[1] == (200, "init: true nil mode: ffi\nunary: true Hello host!\n"), log[-3000:]


def test_resty_ffi_mode_finds_the_module_as_the_ffi_mode_does(env, tmp_path):
    """No module= and no GRPC_WASM_MODULE: the module next to the shim
    (GRPC_WASM_SHIM); missing, it is named with where it was sought; one
    that libffi_init refuses says why."""
    shim = tmp_path / "liblua_shim.so"
    os.symlink(SHIM, shim)
    empty = tmp_path / "empty.wasm"
    empty.write_bytes(b"\0asm\x01\0\0\0")
    proxy = Nginx(env, workers=1, http_extra=FAKE_RESTY_FFI, shim=str(shim), wasm="")
    try:
        missing = proxy.get("/t/real_hosts?case=init&mode=resty_ffi")
        refused = proxy.get(f"/t/real_hosts?case=init&mode=resty_ffi&module={empty}")
        os.symlink(WASM, tmp_path / "grpc_wasm.wasm")
        found = proxy.get("/t/real_hosts?case=init&mode=resty_ffi")
    finally:
        proxy.stop()
    log = proxy.log()
    assert missing == (200, f"init: false grpc_wasm.wasm not found: {tmp_path}/grpc_wasm.wasm: No such file or "
                            f"directory (sought next to the shim {shim}; set grpc.init{{module = path}} or "
                            "GRPC_WASM_MODULE) mode: nil\n"), log[-3000:]
    assert refused == (200, f"init: false ngx.load_ffi({shim}) failed (libffi_init returned 1): the wasm module "
                            "lacks the export 'memory' mode: nil\n"), log[-3000:]
    assert found == (200, "init: true nil mode: resty_ffi\nunary: true Hello host!\n"), log[-3000:]
    check_log(proxy)


def test_an_idle_cosocket_connection_logs_no_error(env):
    started = time.time()
    (answer,), log = run(env, "/t/real_hosts?case=idle&idle=500&sleep=2.5")
    assert answer == (200, "true Hello idle 1!\ntrue Hello idle 2!\n"), log[-3000:]
    assert time.time() - started < 15
    # The harness's own readiness probe (GET /) is the one error allowed.
    errors = [line for line in log.splitlines() if "[error]" in line and 'index.html" is not found' not in line]
    assert errors == [], log[-3000:]

"""What Envoy does with the README's `failure_policy: FAIL_RELOAD` when a
filter's module traps: the failing request gets an error, and a new VM
serves the requests after it. grpc-wasm's module has no known trap left, so
a module built to trap (data/trap_filter.rs) stands in for it, with exactly
the filter configuration the README and the other tests use."""

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness.envoy import Envoy, free_port, scratch_dir, wasm_filter

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def trap_module():
    out = os.path.join(scratch_dir("grpc-wasm-trap-"), "trap_filter.wasm")
    subprocess.run(["rustc", "--edition", "2021", "--target", "wasm32-wasip1", "--crate-type", "cdylib",
                    "-C", "opt-level=2", "-C", "panic=abort", os.path.join(HERE, "data", "trap_filter.rs"),
                    "-o", out], check=True)
    return out


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_trapped_vm_fails_its_request_and_is_reloaded(trap_module):
    proxy = Envoy({}, [("/", "unused", free_port())], http_filters=[wasm_filter({}, module=trap_module)])
    try:
        assert get(proxy.port, "/ok") == (200, "ok"), proxy.log()
        assert get(proxy.port, "/trap") == (503, ""), proxy.log()
        # The VM is rebuilt after 1 s (then backing off); until then the
        # filter's requests fail the same way.
        trapped = time.time()
        deadline = trapped + 10
        while (answer := get(proxy.port, "/ok")) != (200, "ok"):
            assert answer[0] == 503, answer
            assert time.time() < deadline, (answer, proxy.log())
            time.sleep(0.2)
        print(f"served again {time.time() - trapped:.2f} s after the trap")
        # Every later trap is recovered from too.
        assert get(proxy.port, "/trap")[0] == 503
        deadline = time.time() + 10
        while get(proxy.port, "/ok") != (200, "ok"):
            assert time.time() < deadline, proxy.log()
            time.sleep(0.2)
    finally:
        proxy.stop()

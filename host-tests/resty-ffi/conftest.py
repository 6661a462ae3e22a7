"""One harness per test session: it exports the ngx_http_lua_ffi_* symbols
globally, so a second copy would shadow or be shadowed by the first."""

import os
import subprocess

import pytest

from harness.resty_ffi import Harness

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def harness_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("resty-ffi")
    subprocess.run(["sh", os.path.join(HERE, "build.sh"), str(out)], check=True)
    return out, Harness(out / "libresty_ffi_harness.so")

"""One version for the project: the workspace's, which the module, the
shim, the Lua API and the npm package all say, and a mismatch refused."""

import json
import os
import re

import pytest

from harness.nginx import Nginx
from harness.paths import ROOT, SHIM


def read(*path, mode="r"):
    with open(os.path.join(ROOT, *path), mode) as f:
        return f.read()


def workspace_version():
    text = read("Cargo.toml")
    return re.search(r'\[workspace\.package\][^\[]*?\nversion = "([^"]+)"', text).group(1)


def test_every_artifact_says_the_workspace_version():
    version = workspace_version()
    shim_lua = read("lua-shim", "lib", "resty", "ffi", "grpc", "shim.lua")
    assert f'VERSION = "{version}"' in shim_lua
    package = json.loads(read("js", "npm", "package.json"))
    assert package["version"] == version
    # The shim's own, and the module's (which the shim checks at load).
    assert f"{version}\0".encode() in read(SHIM, mode="rb")


@pytest.mark.parametrize("mode", ["ffi"])
def test_a_shim_of_another_release_is_refused(mode):
    version = workspace_version()
    proxy = Nginx({}, workers=1, mode=mode)
    try:
        assert proxy.get("/t/version") == (200, f"{version} {version} true nil\n")
    finally:
        proxy.stop()
    proxy = Nginx({}, workers=1, mode=mode)
    try:
        status, body = proxy.get("/t/version?claim=9.9.9")
        assert status == 200
        assert body == (f"9.9.9 9.9.9 false resty.ffi.grpc is 9.9.9, and {SHIM} is {version}: "
                        "install both from the same release\n"), body
    finally:
        proxy.stop()


def test_exiting_workers_remove_their_wake_up_sockets(tmp_path):
    """Each worker's wake-up socket lives in a private directory; a worker
    that exits removes it (191 were left on one machine before)."""
    from harness.nginx import Server
    from harness.paths import PROTOS
    greeter = Server("greeter-server")
    proxy = Nginx({"socket_dir": str(tmp_path), "greeter": greeter.addr, "protos": PROTOS}, workers=2)
    try:
        for _ in range(4):
            assert proxy.get("/t/socket_dir") == (200, "true Hello s!\n")
        assert [p.name.startswith("grpc-wasm-") for p in tmp_path.iterdir()] != []
    finally:
        proxy.stop()
        greeter.stop()
    assert list(tmp_path.iterdir()) == []

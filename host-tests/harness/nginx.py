"""Real nginx (Debian's nginx + libnginx-mod-http-lua + lua-resty-core +
lua-cjson) with resty.ffi.grpc loaded through LuaJIT's FFI (no C module),
against the tonic test servers."""

import os
import re
import subprocess
import time
import urllib.error
import urllib.request

# Re-exported: the nginx tests take their servers and ports from here.
from .envoy import Server, free_port, scratch_dir  # noqa: F401
from .paths import BIN, CERTS, HOST_TESTS, ROOT, SHIM, WASM

# The nginx tests' own Lua (content_by_lua_file per location).
HERE = os.path.join(HOST_TESTS, "nginx")
LUA = os.path.join(HERE, "lua")

CONF = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off;
# The tests run as root in temporary directories that only root can read.
user root;
master_process on;
worker_processes {workers};
error_log {prefix}/logs/error.log info;
pid {prefix}/logs/nginx.pid;
env GRPC_WASM_SHIM={shim};
env GRPC_WASM_MODULE={wasm};
env GRPC_WASM_CACHE_DIR={cache};
env GRPC_WASM_TRANSPORT={transport};
env GRPC_WASM_MODE={mode};
# The shim's test-only entry points (grpc_wasm_test_panic).
env GRPC_WASM_TEST_HOOKS=1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    lua_package_path "{prefix}/?.lua;{lib}/?.lua;{lua}/?.lua;{here}/lua/?.lua;/usr/share/lua/5.1/?.lua;;";
    {http_extra}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location ~ ^/t/(\\w+)$ {{
            content_by_lua_file {lua}/$1.lua;
        }}
    }}
}}
"""


def ensure_certs():
    if not os.path.exists(os.path.join(CERTS, "client1.key")):
        subprocess.run([os.path.join(BIN, "gen-certs"), "--out", CERTS], check=True, capture_output=True)
    return CERTS


class Nginx:
    """nginx on a free port; `testenv.lua` tells the Lua tests where things are."""

    def __init__(self, env, workers=2, http_extra="", transport="cosocket", mode="", shim=SHIM, wasm=WASM,
                 lua=LUA, cache=None):
        """mode, shim, wasm: GRPC_WASM_MODE, _SHIM, _MODULE ("" leaves one unset);
        lua: the directory whose <name>.lua answers /t/<name>; cache: the
        compiled module's directory (default: the user's, warm)."""
        self.prefix = scratch_dir("grpc-wasm-nginx-")
        os.makedirs(os.path.join(self.prefix, "logs"))
        self.port = free_port()
        cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "grpc-wasm")
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(self.prefix, "nginx.conf"), "w") as f:
            f.write(CONF.format(workers=workers, prefix=self.prefix, shim=shim, wasm=wasm, cache=cache, mode=mode,
                                lib=os.path.join(ROOT, "lua-shim", "lib"), lua=lua, here=HERE,
                                port=self.port, http_extra=http_extra, transport=transport))
        with open(os.path.join(self.prefix, "testenv.lua"), "w") as f:
            f.write("return {\n" + "".join(f"  {k} = {v!r},\n" for k, v in env.items()).replace("'", '"') + "}\n")
        self.proc = subprocess.Popen(["nginx", "-p", self.prefix, "-c", os.path.join(self.prefix, "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.wait_ready()

    # Generous: the time is spent only when nginx fails to start.
    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}:\n{self.log()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1)
            except urllib.error.HTTPError:
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise RuntimeError(f"nginx not ready:\n{self.log()}")

    def get(self, path, timeout=60):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def log(self):
        try:
            return open(os.path.join(self.prefix, "logs", "error.log")).read()
        except OSError:
            return "(no log)"

    def wait_for_log(self, text, count=1, timeout=30):
        """Waits until `text` is in the log `count` times: a marker the Lua
        side logs, so that a test acts on what happened, not on a sleep."""
        deadline = time.time() + timeout
        while self.log().count(text) < count:
            if time.time() > deadline:
                raise AssertionError(f"{text!r} not logged {count} times in {timeout} s:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    def stop(self):
        # QUIT: a graceful stop, so that a worker that cannot exit shows.
        if self.proc.poll() is None:
            self.proc.send_signal(3)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Its workers first: they outlive a killed master.
                subprocess.run(["pkill", "-9", "-P", str(self.proc.pid)], check=False)
                self.proc.kill()
                self.proc.wait()


def check_log(proxy):
    log = proxy.log()
    # After the whole suite: no crash, no worker exit, no alert.
    assert "[alert]" not in log, log[-5000:]
    assert "[emerg]" not in log, log[-5000:]
    assert "[crit]" not in log, log[-5000:]
    # Workers exit only at the final graceful stop, and cleanly.
    assert not re.search(r"exited on signal|exited with code [1-9]", log), log[-5000:]
    assert proxy.proc.returncode == 0, log[-5000:]

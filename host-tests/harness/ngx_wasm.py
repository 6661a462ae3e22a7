"""The grpc-wasm filter in Kong's ngx_wasm_module: nginx 1.27.4 built with the
module on wasmtime (scripts/build-ngx-wasm.sh, cached), configured as the
README's ngx_wasm_module section says, in front of grpc_pass."""

import json
import os
import subprocess
import time
import urllib.error

from . import config_schema
from .envoy import free_port, post_json, scratch_dir, stop_process
from .paths import ROOT, WASM

BUILD_SCRIPT = os.path.join(ROOT, "scripts", "build-ngx-wasm.sh")

# The README's configuration. The filter's configuration is fetched from a
# server of this nginx (a directive's parameter holds at most 4 KB); the
# location clears nginx's unparsed URI so that grpc_pass sends the path the
# filter set, and sends `te: trailers` (nginx forwards only the client's TE,
# and a header set by a filter does not count); the body buffers hold what max_request_bytes and
# max_response_bytes allow.
CONF = """
daemon off;
user root;
master_process on;
worker_processes {workers};
error_log {prefix}/logs/error.log info;
pid {prefix}/logs/nginx.pid;
events {{ worker_connections 4096; }}
wasm {{
    module grpc_wasm {wasm};
}}
http {{
    access_log off;
    client_max_body_size 16m;
    client_body_buffer_size {body_buffer};
    wasm_response_body_buffers {response_buffers};
    server {{
        listen 127.0.0.1:{config_port};
        location = /grpc-wasm.json {{ alias {prefix}/grpc-wasm.json; }}
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        http2 on;
        proxy_wasm grpc_wasm '{inline}';
{locations}
    }}
}}
"""

LOCATION = """        location ^~ {prefix} {{
            rewrite ^(.*)$ $1 break;
            grpc_set_header TE trailers;
            grpc_pass grpc://127.0.0.1:{port};
        }}
"""


def nginx_binary():
    """The cached build (about 15 minutes the first time)."""
    out = subprocess.run([BUILD_SCRIPT], check=True, capture_output=True, text=True, timeout=3600)
    return out.stdout.strip().splitlines()[-1]


class NgxWasm:
    """nginx + ngx_wasm_module on free loopback ports, with the same face as
    harness.Envoy (port, post, log, stop). `routes`: (path prefix, name,
    upstream port); `inline`: a configuration given in the directive itself
    instead of fetched; `sha256`: the fetch's "sha256"."""

    def __init__(self, plugin_config, routes, workers=1, inline=None,
                 body_buffer="16m", response_buffers="8 1m", wait=True, sha256=None, module=WASM,
                 ours=True, with_filter=True, keepalive=0):
        """`module`: another proxy-wasm module in the filter's place; with
        `ours=False` it is not this filter (the benchmark's empty one): its
        configuration is not checked against the schema, nor is it probed
        for readiness. `with_filter=False`: nginx proxying gRPC with no
        filter at all. `keepalive`: idle upstream connections each worker
        keeps (an upstream block per route), as Envoy keeps its own; 0
        opens one per request."""
        # What the filter is given (inline and fetched) is what Kong's
        # metadata says a configuration may be.
        ours = ours and with_filter
        if ours:
            config_schema.check(plugin_config)
        self.port, self.config_port = free_port(), free_port()
        self.prefix = scratch_dir("grpc-wasm-ngx-")
        os.makedirs(os.path.join(self.prefix, "logs"))
        with open(os.path.join(self.prefix, "grpc-wasm.json"), "w") as f:
            json.dump(plugin_config, f)
        if inline is None:
            inline = {"fetch": {"upstream": f"127.0.0.1:{self.config_port}", "path": "/grpc-wasm.json"}}
            if sha256 is not None:
                inline["fetch"]["sha256"] = sha256
        if ours:
            config_schema.check(inline)
        text = json.dumps(inline)
        assert "'" not in text, "the inline configuration is quoted with '"
        locations = "".join(LOCATION.format(prefix=p, port=port) for p, _, port in routes)
        upstreams = ""
        if keepalive:
            upstreams = "".join(f"    upstream up_{port} {{ server 127.0.0.1:{port}; keepalive {keepalive}; }}\n"
                                for _, _, port in routes)
            locations = locations.replace("grpc://127.0.0.1:", "grpc://up_")
        conf = CONF.format(workers=workers, prefix=self.prefix, wasm=module, body_buffer=body_buffer,
                           response_buffers=response_buffers, config_port=self.config_port,
                           port=self.port, inline=text, locations=locations)
        if upstreams:
            conf = conf.replace("http {\n", "http {\n" + upstreams, 1)
        if not with_filter:
            directive = f"        proxy_wasm grpc_wasm '{text}';\n"
            assert directive in conf, "the filter's directive, to take out"
            conf = conf.replace(directive, "")
        self.conf_path = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf_path, "w") as f:
            f.write(conf)
        self.proc = subprocess.Popen([nginx_binary(), "-p", self.prefix, "-c", self.conf_path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if wait and ours:
            self.wait_ready()

    def wait_ready(self, timeout=60):
        """Until the filter answers with its configuration loaded: a JSON
        call to a method no proto defines gets the filter's 404."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}:\n{self.log()}")
            try:
                last = self.post("/grpc_wasm.Probe/Ready", {})
                if last[0] == 404:
                    return
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"nginx with ngx_wasm_module not ready after {timeout}s ({last}):\n{self.log()}")

    def log(self):
        try:
            return open(os.path.join(self.prefix, "logs", "error.log")).read()[-20000:]
        except OSError:
            return "(no log)"

    def post(self, path, body, headers=None):
        return post_json(self.port, path, body, headers)

    def worker_pids(self):
        out = subprocess.run(["pgrep", "-f", "nginx: worker process"], capture_output=True, text=True)
        master = self.proc.pid
        pids = []
        for pid in out.stdout.split():
            try:
                with open(f"/proc/{pid}/status") as f:
                    if f"PPid:\t{master}\n" in f.read():
                        pids.append(int(pid))
            except OSError:
                pass
        return pids

    def stop(self):
        stop_process(self.proc)

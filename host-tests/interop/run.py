"""`make interop`: gRPC's interop client cases with resty.ffi.grpc in real
nginx against grpcio's TestService (interop_server.py), on each transport
(cosocket, runtime, and the lua-resty-ffi path) and each security
(plaintext, TLS, mutual TLS). Prints every case and a final
"N passed, N failed"; exits 1 if any case failed or nginx logged an alert."""

import os
import re
import subprocess
import sys

from harness.interop import start_interop_server
from harness.nginx import Nginx, ensure_certs, scratch_dir
from harness.paths import PROTOS

HERE = os.path.dirname(os.path.abspath(__file__))

SECURITIES = ("plaintext", "tls", "mtls")


def start_server(certs):
    proc, ports = start_interop_server(certs)
    return proc, {f"interop_{k}": f"127.0.0.1:{v}" for k, v in ports.items()}


def hosts(env):
    """(name, Nginx arguments) for each way resty.ffi.grpc reaches the server."""
    harness = scratch_dir("grpc-wasm-harness-")
    subprocess.run(["sh", os.path.join(HERE, "..", "resty-ffi", "build.sh"), harness], check=True)
    yield "cosocket", dict(transport="cosocket")
    yield "runtime", dict(transport="runtime")
    yield "resty_ffi", dict(mode="resty_ffi", http_extra='init_by_lua_block { require("fake_resty_ffi") }',
                            env=dict(env, resty_ffi_harness=os.path.join(harness, "libresty_ffi_harness.so")))


def problems_in(log):
    """What in nginx's log means a defect whatever the cases said."""
    found = [line for line in log.splitlines() if re.search(r"\[(alert|emerg|crit)\]", line)]
    found += re.findall(r".*(?:exited on signal|exited with code [1-9]).*", log)
    return found


def run_host(name, kwargs, env):
    args = dict(kwargs)
    host_env = args.pop("env", env)
    nginx = Nginx(host_env, lua=os.path.join(HERE, "lua"), **args)
    results = []
    try:
        for security in SECURITIES:
            status, body = nginx.get(f"/t/interop?security={security}", timeout=300)
            lines = body.splitlines() if status == 200 else [f"(all): FAILED HTTP {status}: {body[-2000:]}"]
            results += [f"{name} {security} {line}" for line in lines]
    finally:
        nginx.stop()
    results += [f"{name} nginx log: FAILED {line}" for line in problems_in(nginx.log())]
    if nginx.proc.returncode != 0:
        results.append(f"{name} nginx: FAILED exited with {nginx.proc.returncode}")
    return results


def main():
    certs = ensure_certs()
    server, addrs = start_server(certs)
    env = dict(addrs, certs=certs, protos=PROTOS)
    results = []
    try:
        for name, kwargs in hosts(env):
            for line in run_host(name, kwargs, env):
                print(line, flush=True)
                results.append(line)
    finally:
        server.kill()
        server.wait()
    passed = sum(1 for line in results if line.endswith(": ok"))
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

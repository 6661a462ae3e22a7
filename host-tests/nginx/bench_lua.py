"""`make bench-lua`: N sequential SayHello calls from one nginx request
handler through resty.ffi.grpc vs the same N calls from a native tonic
client, then with 100 concurrent coroutines / tasks; unpinned, then with
server, nginx and client all pinned to one CPU (taskset). Both transports
of the FFI path: cosocket (HTTP/2 in nginx's thread) and runtime (the
shim's tonic thread). Ratios are measured side by side in one run: Lua
time / tonic time, against tonic making the same calls (with the deadline
resty.ffi.grpc gives every call) and against tonic with no deadline."""

import argparse
import os
import re
import subprocess

from harness.nginx import Nginx, Server
from harness.paths import BIN, PROTOS, WASM


def pinned(cpu):
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


# resty.ffi.grpc gives every call a deadline (10 s unless told otherwise)
# and sends it as grpc-timeout; a deadline costs both ends a timer.
DEADLINE_MS = 10_000


def tonic(addr, calls, concurrency, cpu, deadline_ms=None):
    deadline = ["--timeout-ms", str(deadline_ms)] if deadline_ms else []
    out = subprocess.run([*pinned(cpu), os.path.join(BIN, "tonic-bench"), "--addr", addr, "--calls", str(calls),
                          "--concurrency", str(concurrency), *deadline],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"seconds ([\d.]+)", out).group(1))


def shim_alone(addr, calls, cpu):
    """The same sequential calls through lua_shim::Client in a Rust program:
    module + transport + one thread hop each way, without nginx."""
    out = subprocess.run([*pinned(cpu), os.path.join(BIN, "examples", "client_bench"), WASM, addr,
                          os.path.join(PROTOS, "helloworld.proto"), str(calls)],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([\d.]+) us/call", out).group(1)) * calls / 1e6


TRANSPORTS = ("cosocket", "runtime")


def lua(proxy, calls, concurrency, transport):
    status, body = proxy.get(f"/t/bench?calls={calls}&concurrency={concurrency}&transport={transport}",
                             timeout=600)
    match = re.search(r"seconds ([\d.]+) failures (\d+)", body)
    if status != 200 or not match or match.group(2) != "0":
        raise RuntimeError(f"lua bench failed: {status} {body}\n{proxy.log()[-3000:]}")
    return float(match.group(1))


def run(calls, cpu):
    label = f"pinned to CPU {cpu}" if cpu is not None else "unpinned"
    server = Server("greeter-server")
    proxy = Nginx({"greeter": server.addr, "protos": PROTOS}, workers=1)
    if cpu is not None:
        # -a: every thread (the server's tokio workers, the shim's runtime).
        # The nginx worker's command line is "nginx: worker process": it is
        # found as the master's child, not by the prefix.
        workers = subprocess.run(["pgrep", "-P", str(proxy.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in [str(server.proc.pid), str(proxy.proc.pid), *workers]:
            subprocess.run(["taskset", "-apc", str(cpu), pid], check=True, capture_output=True)
    try:
        for transport in TRANSPORTS:
            lua(proxy, 2000, 1, transport)  # warm-up: compiles the module, fills caches
        rows = []
        for concurrency in (1, 100):
            t_lua = {t: lua(proxy, calls, concurrency, t) for t in TRANSPORTS}
            t_same = tonic(server.addr, calls, concurrency, cpu, DEADLINE_MS)
            t_bare = tonic(server.addr, calls, concurrency, cpu)
            rows.append((concurrency, t_lua, t_same, t_bare))
        t_shim = shim_alone(server.addr, calls, cpu)
        for concurrency, t_lua, t_same, t_bare in rows:
            for transport in TRANSPORTS:
                t = t_lua[transport]
                print(f"{label:>16}  {calls} calls x {concurrency:>3} concurrent, {transport:<8}:"
                      f"  lua {t:7.3f} s ({calls / t:6.0f}/s)"
                      f"  tonic, same deadline {t_same:7.3f} s: ratio {t / t_same:5.2f}x"
                      f"  tonic, no deadline {t_bare:7.3f} s: ratio {t / t_bare:5.2f}x", flush=True)
        print(f"{label:>16}  {calls} calls x   1 through lua_shim::Client (runtime) without nginx:"
              f" {t_shim:7.3f} s  ratio {t_shim / rows[0][2]:5.2f}x (same deadline)"
              f" {t_shim / rows[0][3]:5.2f}x (none)", flush=True)
    finally:
        proxy.stop()
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    print("resty.ffi.grpc (nginx, LuaJIT FFI path) vs native tonic, SayHello, one connection; tonic runs"
          f" once with the {DEADLINE_MS} ms deadline resty.ffi.grpc sends, once without any", flush=True)
    run(args.calls, None)
    run(args.calls, 0)


if __name__ == "__main__":
    main()

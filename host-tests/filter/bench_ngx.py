"""JSON -> gRPC -> JSON through Kong's ngx_wasm_module (nginx, one worker) with
the filter, against Envoy (--concurrency 1) with the same filter and with
Envoy's native grpc_json_transcoder: the same greeter-server and the same
h2load load, rounds interleaved, requests/s and the proxy's CPU per request
(nginx's worker; Envoy's process), as ratios within one run (issue 32).
Then each host's floors, plain gRPC through it: with no filter, and with a
wasm filter that does nothing (host-tests/envoy/empty_filter.wat), which is
what the host charges any wasm filter before it does anything.

    python3 host-tests/filter/bench_ngx.py [--requests N] [--rounds R]
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
import types

from harness.envoy import Envoy, Server, read_protos, scratch_dir, wasm_filter
from harness.ngx_wasm import NgxWasm
from harness.throughput import (
    CLIENTS,
    GRPC_HEADERS,
    JSON_HEADERS,
    STREAMS,
    WARMUP,
    busy_cpus,
    check_grpc,
    check_json,
    descriptor_set,
    measure,
    medians,
    native_transcoder,
    write_bodies,
)

# Idle upstream connections nginx keeps, as Envoy keeps its own: without an
# upstream block, grpc_pass opens a connection per request.
KEEPALIVE = 64
EMPTY_FILTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "envoy", "empty_filter.wat")


def nginx_case(proxy):
    """measure() reads the proxy's port and the pid whose CPU it counts: the one worker."""
    pids = proxy.worker_pids()
    if len(pids) != 1:
        raise RuntimeError(f"expected one nginx worker, found {pids}")
    return types.SimpleNamespace(port=proxy.port, proc=types.SimpleNamespace(pid=pids[0]))


def checked_grpc(proxy, timeout=30):
    """check_grpc once the proxy listens (nginx without our filter has no
    readiness probe)."""
    deadline = time.time() + timeout
    while True:
        try:
            return check_grpc(proxy)
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per measured run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    args = parser.parse_args()
    for tool in ("h2load", "wasm-as"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: `make bench-ngx` installs what it needs (scripts/install-deps.sh)")
    directory = scratch_dir("grpc-wasm-bench-ngx-")
    bodies = write_bodies(directory)
    empty = os.path.join(directory, "empty_filter.wasm")
    subprocess.run(["wasm-as", EMPTY_FILTER, "-o", empty], check=True)
    server = Server("greeter-server")
    routes = [("/", "greeter", server.port)]
    config = {"protos": read_protos("helloworld.proto")}
    proxies, cases = [], []

    def add(name, proxy, grpc=False):
        proxies.append(proxy)
        reply_size = checked_grpc(proxy) if grpc else check_json(proxy)
        measured = nginx_case(proxy) if isinstance(proxy, NgxWasm) else proxy
        cases.append({"name": name, "proxy": measured, "headers": GRPC_HEADERS if grpc else JSON_HEADERS,
                      "body": bodies["grpc" if grpc else "json"], "reply_size": reply_size})

    try:
        add("ngx_wasm_module", NgxWasm(config, routes, keepalive=KEEPALIVE))
        add("Envoy, grpc-wasm", Envoy(config, routes))
        add("Envoy, native", Envoy(None, routes, [native_transcoder(descriptor_set(directory))]))
        plain = {"module": empty, "ours": False, "keepalive": KEEPALIVE}
        add("nginx, gRPC", NgxWasm(None, routes, with_filter=False, **plain), grpc=True)
        add("nginx, gRPC, empty", NgxWasm({}, routes, **plain), grpc=True)
        add("Envoy, gRPC", Envoy(None, routes, []), grpc=True)
        add("Envoy, gRPC, empty", Envoy(None, routes, [wasm_filter("", empty, check_schema=False)]), grpc=True)
        print(f"h2load -c {CLIENTS} -m {STREAMS} -n {args.requests} (warm-up {WARMUP}), {args.rounds} "
              f"interleaved round(s); CPUs busy before: {busy_cpus():.2f} of {os.cpu_count()}")
        runs = {c["name"]: [] for c in cases}
        for _ in range(args.rounds):
            for case in cases:
                runs[case["name"]].append(measure(case, args.requests, directory))
    finally:
        for proxy in proxies:
            proxy.stop()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    summary = medians(runs)
    native = summary["Envoy, native"]
    print(f"\n{'':<20} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} {'req/s vs native':>16} "
          f"{'CPU vs native':>14}")
    for name, s in summary.items():
        print(f"{name:<20} {s['rps']:>9.0f} {s['p50']:>8.2f} {s['p99']:>8.2f} {s['cpu']:>11.1f} "
              f"{s['rps'] / native['rps']:>15.2f}x {s['cpu'] / native['cpu']:>13.2f}x")
    for host in ("nginx", "Envoy"):
        plain, empty_cpu = summary[f"{host}, gRPC"]["cpu"], summary[f"{host}, gRPC, empty"]["cpu"]
        print(f"{host}: an empty wasm filter adds {empty_cpu - plain:.1f} us of CPU per request to plain gRPC")

if __name__ == "__main__":
    main()

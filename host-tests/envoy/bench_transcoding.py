"""JSON -> gRPC -> JSON through Envoy: the grpc-wasm filter against Envoy's native
grpc_json_transcoder, with plain gRPC through Envoy as the floor, all against the same
greeter-server, measured with h2load (Debian package nghttp2-client).

    python3 host-tests/envoy/bench_transcoding.py [--requests N] [--rounds R]
"""

import argparse
import os
import shutil
import sys

from harness.envoy import Envoy, Server, read_protos, scratch_dir
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

GOAL = 0.9  # ours / native throughput


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per measured run")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the median is reported")
    args = parser.parse_args()
    if args.requests < CLIENTS:
        parser.error(f"--requests must be at least {CLIENTS}")
    if not shutil.which("h2load"):
        sys.exit("h2load not found: install it with `apt-get install -y nghttp2-client`")

    directory = scratch_dir("grpc-wasm-bench-")
    bodies = write_bodies(directory)

    server = Server("greeter-server")
    clusters = [("/", "greeter", server.port)]
    proxies = []
    try:
        ours = Envoy({"protos": read_protos("helloworld.proto")}, clusters)
        proxies.append(ours)
        native = Envoy(None, clusters, [native_transcoder(descriptor_set(directory))])
        proxies.append(native)
        plain = Envoy(None, clusters, [])
        proxies.append(plain)
        cases = [
            {"name": "grpc-wasm (ours)", "proxy": ours, "headers": JSON_HEADERS, "body": bodies["json"],
             "reply_size": check_json(ours)},
            {"name": "native transcoder", "proxy": native, "headers": JSON_HEADERS, "body": bodies["json"],
             "reply_size": check_json(native)},
            {"name": "plain gRPC", "proxy": plain, "headers": GRPC_HEADERS, "body": bodies["grpc"],
             "reply_size": check_grpc(plain)},
        ]

        busy = busy_cpus()
        print(f"h2load -c {CLIENTS} -m {STREAMS} -n {args.requests} (warm-up {WARMUP}), "
              f"Envoy --concurrency 1, {args.rounds} round(s); CPUs busy before: {busy:.2f} of {os.cpu_count()}")
        if busy > 0.2:
            print("warning: the machine is busy; req/s will be low and noisy (Envoy CPU per request less so)")
        runs = {c["name"]: [] for c in cases}
        for r in range(args.rounds):
            for case in cases:
                result = measure(case, args.requests, directory)
                runs[case["name"]].append(result)
                if args.rounds > 1:
                    print(f"  round {r + 1} {case['name']:<18} {result['rps']:>9.0f} req/s "
                          f"{result['cpu']:>6.1f} us CPU/req")
    finally:
        for proxy in proxies:
            proxy.stop()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)

    summary = medians(runs)
    # Envoy's CPU time per request is the cost the filter controls; req/s also moves with
    # whatever else shares the two cores.
    print(f"\n{'':<18} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'Envoy CPU us/req':>17}")
    for name, s in summary.items():
        print(f"{name:<18} {s['rps']:>9.0f} {s['p50']:>8.2f} {s['p99']:>8.2f} {s['cpu']:>17.1f}")
    to_native = summary["grpc-wasm (ours)"]["rps"] / summary["native transcoder"]["rps"]
    to_plain = summary["grpc-wasm (ours)"]["rps"] / summary["plain gRPC"]["rps"]
    verdict = "met" if to_native >= GOAL else "NOT met"
    print(f"\nours / native throughput:     {to_native:.2f}  (goal >= {GOAL}: {verdict})")
    print(f"ours / plain gRPC throughput: {to_plain:.2f}")
    print(f"ours / native, as Envoy CPU per request allows: "
          f"{summary['native transcoder']['cpu'] / summary['grpc-wasm (ours)']['cpu']:.2f}")


if __name__ == "__main__":
    main()

"""Instructions Envoy runs per JSON -> gRPC -> JSON request, counted by callgrind
(all of Envoy's threads, the V8-compiled module included): the filter, optionally
the filter built from another .wasm, and Envoy's native grpc_json_transcoder;
then the floors: plain gRPC through Envoy, and plain gRPC through a wasm
filter that does nothing (empty_filter.wat), which is what being a wasm
filter costs before any work. Wall-clock rounds on a shared 2-core VM move by
several microseconds per request; these counts repeat to within 0.5k.

    python3 host-tests/envoy/count_instructions.py [--other OLD.wasm] [--requests N]
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import urllib.request

from harness.callgrind import dump, instructions
from harness.envoy import Server, envoy_binary, envoy_config, free_port, read_protos, scratch_dir, wasm_filter
from harness.paths import WASM
from harness.throughput import (
    GRPC_HEADERS,
    GRPC_REQUEST,
    JSON_HEADERS,
    JSON_REQUEST,
    PATH,
    descriptor_set,
    native_transcoder,
)

WARMUP = 200


def launch_under_callgrind(http_filters, server, directory, cluster="greeter"):
    """Envoy (one worker) under callgrind, routing everything to `server`:
    (its process, its port, callgrind's output path), once it is ready."""
    port, admin = free_port(), free_port()
    config = os.path.join(directory, f"envoy-{port}.json")
    with open(config, "w") as f:
        json.dump(envoy_config(port, admin, None, [("/", cluster, server.port)], http_filters), f)
    out = os.path.join(directory, f"callgrind-{port}.out")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", envoy_binary(), "-c", config,
         "--concurrency", "1", "--disable-hot-restart", "--base-id", str(random.randint(1000, 60000)),
         "-l", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(admin, proc)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=120)
        raise
    return proc, port, out


def count(http_filters, server, directory, requests, grpc=False):
    """Instructions per request: a dump after the warm-up, another after `requests`.
    `grpc`: plain gRPC requests rather than JSON ones."""
    proc, port, out = launch_under_callgrind(http_filters, server, directory)
    try:
        body = os.path.join(directory, "request.grpc" if grpc else "request.json")
        with open(body, "wb") as f:
            f.write(GRPC_REQUEST if grpc else JSON_REQUEST)
        headers = GRPC_HEADERS if grpc else JSON_HEADERS
        load(port, body, WARMUP, headers)
        dump(proc)
        load(port, body, requests, headers)
        dump(proc)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return instructions(f"{out}.2") / requests


def wait_ready(admin, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy under valgrind exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("envoy under valgrind not ready")


def load(port, body, requests, headers):
    """Sequential requests (one client, one stream), each checked to be a 200."""
    result = subprocess.run(["h2load", "-c1", "-m1", "-n", str(requests), "-d", body,
                             *[a for h in headers for a in ("-H", h)], f"http://127.0.0.1:{port}{PATH}"],
                            capture_output=True, text=True, timeout=1800)
    match = re.search(r"status codes: (\d+) 2xx", result.stdout)
    if not match or int(match.group(1)) != requests:
        raise RuntimeError(f"not every request succeeded:\n{result.stdout[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", help="another build of the module, counted too")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    for tool, package in [("valgrind", "valgrind"), ("h2load", "nghttp2-client")]:
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: install it with `apt-get install -y {package}`")
    server = Server("greeter-server")
    directory = scratch_dir("grpc-wasm-callgrind-")
    protos = {"protos": read_protos("helloworld.proto")}
    builds = [("grpc-wasm (ours)", [wasm_filter(protos, WASM)])]
    if args.other:
        builds.append((f"grpc-wasm ({os.path.basename(args.other)})", [wasm_filter(protos, args.other)]))
    builds.append(("native transcoder", [native_transcoder(descriptor_set(directory))]))
    empty = os.path.join(directory, "empty_filter.wasm")
    subprocess.run(["wasm-as", os.path.join(os.path.dirname(os.path.abspath(__file__)), "empty_filter.wat"),
                    "-o", empty], check=True)
    floors = [("plain gRPC", []), ("plain gRPC, empty wasm filter", [wasm_filter("", empty, check_schema=False)])]
    try:
        counts = {name: count(filters, server, directory, args.requests) for name, filters in builds}
        counts |= {name: count(filters, server, directory, args.requests, grpc=True) for name, filters in floors}
    finally:
        server.stop()
    print(f"Envoy instructions per request (callgrind, {args.requests} sequential requests after {WARMUP}):")
    native = counts["native transcoder"]
    for name, n in counts.items():
        print(f"  {name:<32} {n / 1000:7.1f}k   native / this {native / n:.2f}")


if __name__ == "__main__":
    main()

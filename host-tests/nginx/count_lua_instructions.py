"""Instructions per SayHello call through resty.ffi.grpc, counted by callgrind:
nginx in one process (no master) under callgrind, all its threads (the
runtime transport's included), sequential calls from one request handler
per transport; and tonic's client making the same calls (tonic-bench under
callgrind, all threads). Wall time on this 2-core machine moves by tenths
between runs (`make bench-lua`); these counts repeat to within 1%.

    python3 host-tests/nginx/count_lua_instructions.py [--calls N]
"""

import argparse
import os
import re
import shutil
import subprocess
import time

from harness.callgrind import dump, instructions
from harness.nginx import Nginx, Server, scratch_dir
from harness.paths import BIN, PROTOS

WARMUP = 300
TRANSPORTS = ("cosocket", "runtime")


def calls(proxy, n, transport):
    status, body = proxy.get(f"/t/bench?calls={n}&concurrency=1&transport={transport}", timeout=1800)
    if status != 200 or not re.search(r"failures 0\b", body):
        raise RuntimeError(f"bench failed: {status} {body}\n{proxy.log()[-3000:]}")


def count_lua(server, calls_n):
    """{transport: instructions per call} in nginx's one process."""
    proxy = Nginx({"greeter": server.addr, "protos": PROTOS}, workers=1)
    proxy.stop()
    conf = os.path.join(proxy.prefix, "nginx.conf")
    with open(conf) as f:
        text = f.read().replace("master_process on;", "master_process off;")
    with open(conf, "w") as f:
        f.write(text)
    out = os.path.join(proxy.prefix, "callgrind.out")
    proxy.proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                   "nginx", "-p", proxy.prefix, "-c", conf],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    result = {}
    try:
        proxy.wait_ready(timeout=300)
        dumps = 0
        for transport in TRANSPORTS:
            calls(proxy, WARMUP, transport)
            dump(proxy.proc)
            calls(proxy, calls_n, transport)
            dump(proxy.proc)
            dumps += 2
            result[transport] = instructions(f"{out}.{dumps}") / calls_n
    finally:
        proxy.proc.terminate()
        proxy.proc.wait(timeout=120)
    return result


def count_tonic(server, calls_n):
    """Per call: two runs of tonic-bench, whose difference leaves out start-up."""
    totals = []
    directory = scratch_dir("grpc-wasm-tonic-callgrind-")
    try:
        for n in (WARMUP, WARMUP + calls_n):
            out = os.path.join(directory, f"callgrind.{n}")
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                            os.path.join(BIN, "tonic-bench"), "--addr", server.addr, "--calls", str(n),
                            "--concurrency", "1", "--timeout-ms", "10000"], check=True, capture_output=True)
            totals.append(instructions(out))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return (totals[1] - totals[0]) / calls_n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    server = Server("greeter-server")
    started = time.time()
    try:
        lua = count_lua(server, args.calls)
        tonic = count_tonic(server, args.calls)
    finally:
        server.stop()
    print(f"Instructions per sequential SayHello call (callgrind, {args.calls} calls after {WARMUP}; "
          f"{time.time() - started:.0f} s)")
    print(f"  {'tonic client (same deadline)':<34} {tonic / 1000:7.1f}k")
    for transport, n in lua.items():
        print(f"  {'resty.ffi.grpc, ' + transport:<34} {n / 1000:7.1f}k   / tonic {n / tonic:.2f}")


if __name__ == "__main__":
    main()

"""Throughput side by side in one run (h2load on each proxy, interleaved
rounds, medians) and the requests it sends: what the Envoy and the
ngx_wasm_module benchmarks share (make bench, make bench-ngx) and the
instruction counts reuse."""

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

from .paths import PROTOS

PATH = "/helloworld.Greeter/SayHello"
JSON_REQUEST = b'{"name":"world"}'
JSON_REPLY = {"message": "Hello world!"}
# One gRPC frame: not compressed, 4-byte big-endian length, then HelloRequest{name: "world"}.
GRPC_REQUEST = b"\x00\x00\x00\x00\x07\x0a\x05world"
GRPC_REPLY = b"\x0a\x0cHello world!"
JSON_HEADERS = ["content-type: application/json"]
GRPC_HEADERS = ["content-type: application/grpc", "te: trailers"]
CLIENTS, STREAMS, WARMUP = 100, 10, 2000


def descriptor_set(directory):
    out = os.path.join(directory, "helloworld.pb")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--include_imports",
                    f"--descriptor_set_out={out}", "-I", PROTOS, os.path.join(PROTOS, "helloworld.proto")],
                   check=True)
    return out


def native_transcoder(descriptor):
    return {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
        "proto_descriptor": descriptor,
        "services": ["helloworld.Greeter"],
        # helloworld.proto has no google.api.http rules: without this the native filter maps
        # nothing and would pass the JSON through to the server untouched.
        "auto_mapping": True,
    }}


def check_json(proxy):
    """Returns the size of the reply body, after checking it is the expected one."""
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{PATH}", data=JSON_REQUEST, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw, headers = r.read(), dict(r.headers)
    try:
        reply = json.loads(raw)
    except ValueError:
        reply = None
    if reply != JSON_REPLY:
        raise RuntimeError(f"unexpected reply {raw!r} {headers}:\n{proxy.log()}")
    return len(raw)


def check_grpc(proxy):
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
        reply = channel.unary_unary(PATH)(GRPC_REQUEST[5:], timeout=10)
    if reply != GRPC_REPLY:
        raise RuntimeError(f"unexpected reply {reply!r}:\n{proxy.log()}")
    return 5 + len(reply)


def h2load(port, headers, body_file, requests, log_file=None):
    cmd = ["h2load", "-n", str(requests), "-c", str(CLIENTS), "-m", str(STREAMS), "-d", body_file,
           f"http://127.0.0.1:{port}{PATH}"]
    for h in headers:
        cmd += ["-H", h]
    if log_file:
        cmd += ["--log-file", log_file]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout


def field(pattern, output):
    match = re.search(pattern, output)
    if not match:
        raise RuntimeError(f"h2load output without {pattern!r}:\n{output}")
    return match.group(1)


def busy_cpus(seconds=1.0):
    """How many CPUs something else keeps busy right now (load average lags by minutes)."""
    def sample():
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # idle + iowait
    total, idle = sample()
    time.sleep(seconds)
    total2, idle2 = sample()
    return os.cpu_count() * (1 - (idle2 - idle) / max(1, total2 - total))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(case, requests, directory):
    log_file = os.path.join(directory, "h2load.log")
    port, pid = case["proxy"].port, case["proxy"].proc.pid
    h2load(port, case["headers"], case["body"], WARMUP)
    cpu = cpu_seconds(pid)
    out = h2load(port, case["headers"], case["body"], requests, log_file)
    cpu = cpu_seconds(pid) - cpu
    ok = int(field(r"status codes: (\d+) 2xx", out))
    data = int(field(r"\((\d+)\) data", out))
    # A 2xx can still carry an error (gRPC status in trailers, a JSON error body): every
    # reply having exactly the checked reply's size rules that out.
    if ok != requests or data != requests * case["reply_size"]:
        raise RuntimeError(f"{case['name']}: {ok} of {requests} 2xx, {data} data bytes "
                           f"for {case['reply_size']} per reply:\n{out}")
    with open(log_file) as f:
        latencies = sorted(int(line.split("\t")[2]) for line in f)
    return {"rps": float(field(r"finished in [^,]+, ([\d.]+) req/s", out)), "cpu": cpu / requests * 1e6,
            "p50": percentile(latencies, 0.50) / 1000, "p99": percentile(latencies, 0.99) / 1000}


def write_bodies(directory):
    """{"json": path, "grpc": path}: each request body in a file, for h2load -d."""
    bodies = {}
    for kind, body in [("json", JSON_REQUEST), ("grpc", GRPC_REQUEST)]:
        bodies[kind] = os.path.join(directory, f"request.{kind}")
        with open(bodies[kind], "wb") as f:
            f.write(body)
    return bodies


def medians(runs):
    """{case: {measure: its median over the rounds}} from {case: [measure()'s results]}."""
    return {name: {k: statistics.median(run[k] for run in results) for k in ("rps", "cpu", "p50", "p99")}
            for name, results in runs.items()}


def percentile(values, p):
    return values[max(0, math.ceil(p * len(values)) - 1)]

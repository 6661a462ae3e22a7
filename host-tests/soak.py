"""make soak: both hosts under a long mixed load, loopback only, bounded in
time (SOAK_SECONDS, default 600, per host). Not part of make test.

nginx (resty.ffi.grpc, both transports) and Envoy (the filter, inline
transcoding and callouts) each take 200 concurrent clients (h2load), spread
over a mix of calls: unary, the three streaming kinds, server errors with
details, deadlines that expire, streams closed early, and calls to a server
that is killed and restarted every 30 s. Each request of the mix has an
intended outcome; any other is a failure. Every 10 s the proxy's RSS and
open fds are sampled.

The run fails when a request ends other than intended, when RSS grows more
than 5 MB or fds grow at all from the end of the warm-up to the end, or
when nginx logs an [alert], [crit], [emerg] or a worker exit."""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from harness.envoy import Envoy, Server, free_port, read_protos, scratch_dir
from harness.nginx import Nginx
from harness.paths import BIN, PROTOS

SECONDS = int(os.environ.get("SOAK_SECONDS", "600"))
CLIENTS = 200
SAMPLE_EVERY = 10
RESTART_EVERY = 30
# RSS and fds are compared from here on: the first calls load the module,
# open conns and fill caches.
WARMUP = min(60, SECONDS // 3)
MAX_RSS_GROWTH_KB = 5 * 1024


class RestartingServer:
    """A testing-server on a fixed port, killed and started again every 30 s."""

    def __init__(self):
        self.port = free_port()
        self.proc = self.start()
        self.stopped = threading.Event()
        self.restarts = 0
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def start(self):
        proc = subprocess.Popen([os.path.join(BIN, "testing-server"), "--addr", f"127.0.0.1:{self.port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdout.readline()
        return proc

    def loop(self):
        while not self.stopped.wait(RESTART_EVERY):
            self.proc.kill()
            self.proc.wait()
            time.sleep(0.5)
            self.proc = self.start()
            self.restarts += 1

    def stop(self):
        self.stopped.set()
        self.thread.join()
        self.proc.kill()
        self.proc.wait()


class Job:
    """One h2load process: `clients` connections repeating one request."""

    def __init__(self, name, url, clients, intended, logdir, body=None, headers=()):
        self.name, self.intended = name, intended
        self.log = os.path.join(logdir, name + ".tsv")
        args = ["h2load", "--h1", "-D", str(SECONDS), "-c", str(clients), "--log-file", self.log]
        if body is not None:
            path = os.path.join(logdir, name + ".body")
            with open(path, "wb") as f:
                f.write(body)
            args += ["-d", path]
        for header in headers:
            args += ["-H", header]
        self.proc = subprocess.Popen([*args, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self):
        out = self.proc.communicate(timeout=SECONDS + 120)[0]
        statuses, latencies = {}, []
        with open(self.log) as f:
            for line in f:
                _, status, micros = line.split("\t")[:3]
                statuses[int(status)] = statuses.get(int(status), 0) + 1
                latencies.append(int(micros) / 1000)
        errored = re.search(r"(\d+) errored", out)
        return {"statuses": statuses, "latencies": latencies,
                "errored": int(errored.group(1)) if errored else -1, "out": out}


def clients_each(jobs):
    return max(1, CLIENTS // jobs)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wasm_memory_kb(pids):
    """RSS of the processes' wasm linear memories. wasmtime reserves each
    as several GiB of inaccessible address space and opens its start as
    the memory grows, so a memory is the mapping just before an
    inaccessible one of 1 GiB or more, ending where it begins."""
    total = 0
    for pid in pids:
        previous = None  # (end address, Rss kB) of the mapping before
        start = end = perms = None
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) ", line)
                if head:
                    start, end, perms = int(head.group(1), 16), int(head.group(2), 16), head.group(3)
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1])
                    huge = end - start >= 1 << 30 and perms.startswith("---")
                    if huge and previous and previous[0] == start:
                        total += previous[1]
                    previous = (end, rss)
    return total


def sample_until(done, pids_of, extra=None):
    """Samples (seconds since start, RSS kB, fds[, extra]) of the processes
    pids_of() names, summed, every SAMPLE_EVERY s until done is set."""
    samples, started = [], time.time()
    while True:
        pids = pids_of()
        row = [round(time.time() - started), sum(rss_kb(p) for p in pids), sum(fds(p) for p in pids)]
        if extra:
            row.append(extra())
        samples.append(row)
        if done.wait(SAMPLE_EVERY):
            return samples


def percentile(values, q):
    if not values:
        return 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(host, results, samples, problems):
    """Prints the host's figures; appends to problems what fails the soak."""
    print(f"\n== {host}: {SECONDS} s, {CLIENTS} clients")
    print(f"{'kind':<24} {'requests':>9} {'intended':>9} {'other':>6} {'errored':>7} {'p50 ms':>8} {'p99 ms':>8}")
    all_latencies = []
    for job, r in results:
        total = sum(r["statuses"].values())
        intended = sum(n for s, n in r["statuses"].items() if s in job.intended)
        other = {s: n for s, n in r["statuses"].items() if s not in job.intended}
        all_latencies += r["latencies"]
        print(f"{job.name:<24} {total:>9} {intended:>9} {sum(other.values()):>6} {r['errored']:>7} "
              f"{percentile(r['latencies'], 50):>8.1f} {percentile(r['latencies'], 99):>8.1f}"
              + (f"  statuses {other}" if other else ""))
        if other:
            problems.append(f"{host} {job.name}: unintended statuses {other}")
        if total == 0:
            problems.append(f"{host} {job.name}: no request finished:\n{r['out'][-1500:]}")
    total = len(all_latencies)
    print(f"{'all':<24} {total:>9} {'':>9} {'':>6} {'':>7} {percentile(all_latencies, 50):>8.1f} "
          f"{percentile(all_latencies, 99):>8.1f}")
    print("samples (s, RSS kB, fds[, extra]):", " ".join("/".join(map(str, s)) for s in samples))
    # The last sample comes after the load ended (clients gone); growth is
    # read at the last sample under load.
    under_load = [s for s in samples if s[0] <= SECONDS - 2] or samples
    base = next((s for s in under_load if s[0] >= WARMUP), under_load[0])
    last = under_load[-1]
    print(f"idle after the load ({samples[-1][0]} s): RSS {samples[-1][1]} kB, fds {samples[-1][2]}")
    rss_growth, fd_growth = last[1] - base[1], last[2] - base[2]
    print(f"after warm-up ({base[0]} s): RSS {base[1]} -> {last[1]} kB ({rss_growth:+d}), "
          f"fds {base[2]} -> {last[2]} ({fd_growth:+d})")
    if rss_growth > MAX_RSS_GROWTH_KB:
        problems.append(f"{host}: RSS grew {rss_growth} kB after warm-up")
    if fd_growth > 0:
        problems.append(f"{host}: {fd_growth} more open fds after warm-up")


def worker_pids(nginx):
    pid = nginx.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def soak_nginx(logdir, problems):
    servers = {"testing": Server("testing-server"), "routes": Server("routeguide-server")}
    restarting = RestartingServer()
    nginx = Nginx({"protos": PROTOS}, workers=2)
    try:
        query = {"testing": servers["testing"].addr, "routes": servers["routes"].addr,
                 "restarting": f"127.0.0.1:{restarting.port}"}
        kinds = {"unary": {200}, "server_stream": {200}, "client_stream": {200}, "bidi": {200},
                 "error": {200}, "deadline": {200}, "early_close": {200}, "restart": {200}}
        if os.environ.get("SOAK_KINDS"):
            kinds = {kind: kinds[kind] for kind in os.environ["SOAK_KINDS"].split()}
        transports = os.environ.get("SOAK_TRANSPORTS", "cosocket runtime").split()
        specs = [(kind, transport) for kind in kinds for transport in transports]
        jobs = []
        for kind, transport in specs:
            url = f"http://127.0.0.1:{nginx.port}/t/soak?" + urllib.parse.urlencode(
                dict(query, kind=kind, transport=transport))
            jobs.append(Job(f"{kind}-{transport}", url, clients_each(len(specs)), kinds[kind], logdir))
        done = threading.Event()
        sampler = threading.Thread(target=lambda: samples.extend(
            sample_until(done, lambda: worker_pids(nginx),
                         extra=lambda: wasm_memory_kb(worker_pids(nginx)))))
        samples = []
        sampler.start()
        results = [(job, job.result()) for job in jobs]
        done.set()
        sampler.join()
    finally:
        restarting.stop()
        nginx.stop()
        for s in servers.values():
            s.stop()
    report("nginx + resty.ffi.grpc", results, samples, problems)
    log = nginx.log()
    bad = re.findall(r".*\[(?:alert|crit|emerg)\].*|.*exited on signal.*", log)
    print(f"server restarts: {restarting.restarts}; error log [alert]/[crit]/[emerg]/worker exits: {len(bad)}; "
          "the 4th sample column is the workers' wasm memories (kB, in their RSS)")
    problems += [f"nginx log: {line}" for line in bad[:10]]
    print_heaps(log)
    unintended = {}
    for what in re.findall(r"soak unintended: (.*?), client:", log):
        unintended[what] = unintended.get(what, 0) + 1
    for what, n in sorted(unintended.items(), key=lambda kv: -kv[1])[:20]:
        print(f"unintended x{n}: {what}")


def print_heaps(log):
    """Each worker's Lua heap and C heap (soak_heap.lua logs them, kB):
    first and last after warm-up, so that RSS growth can be told LuaJIT's,
    live C memory, or C memory freed but kept."""
    heaps = {}
    for pid, *values, at in re.findall(
            r"soak heap: (\d+) lua (\d+) used (\d+)\S* free (\d+)\S* mmapped (\d+)\S* at ([\d.]+)", log):
        heaps.setdefault(pid, []).append((float(at), [int(v) for v in values]))
    for pid, points in sorted(heaps.items()):
        start = points[0][0] + WARMUP
        after = [values for at, values in points if at >= start] or [points[-1][1]]
        first, last = after[0], after[-1]
        names = ("lua", "C used", "C free", "C mmapped")
        print(f"worker {pid} heaps after warm-up (kB): " + ", ".join(
            f"{name} {a} -> {b}" for name, a, b in zip(names, first, last, strict=True)))
        print(f"  C used (kB) every 10 s: {' '.join(str(values[1]) for _, values in points)}")


def envoy_memory(admin):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/memory", timeout=5) as r:
        return int(json.loads(r.read())["allocated"]) // 1024


def soak_envoy(logdir, problems):
    servers = {"greeter": Server("greeter-server"), "testing": Server("testing-server")}
    restarting = RestartingServer()
    protos = read_protos("helloworld.proto", "testing.proto")
    inline = Envoy({"protos": protos}, [("/helloworld.", "greeter", servers["greeter"].port),
                                        ("/grpcwasm.testing.Testing/Fail", "testing", servers["testing"].port),
                                        ("/grpcwasm.", "restarting", restarting.port)])
    callout = Envoy({"protos": protos, "callout": {"upstream": "testing", "timeout_ms": 300}},
                    [("/", "unused", free_port()), (None, "testing", servers["testing"].port)])
    try:
        json_header = ["content-type: application/json"]
        specs = [
            ("transcode-unary", inline, "/helloworld.Greeter/SayHello", {"name": "soak"}, {200}),
            ("transcode-error", inline, "/grpcwasm.testing.Testing/Fail",
             {"code": 5, "message": "soak", "withDetails": True}, {404}),
            ("transcode-restart", inline, "/grpcwasm.testing.Testing/Sleep", {"millis": 0}, {200, 503}),
            ("callout-unary", callout, "/grpcwasm.testing.Testing/Sleep", {"millis": 0}, {200}),
            ("callout-stream", callout, "/grpcwasm.testing.Testing/StreamThenFail", {"count": 3}, {200}),
            ("callout-deadline", callout, "/grpcwasm.testing.Testing/Sleep", {"millis": 1000}, {504}),
        ]
        jobs = [Job(name, f"http://127.0.0.1:{proxy.port}{path}", clients_each(len(specs)), intended, logdir,
                    body=json.dumps(body).encode(), headers=json_header)
                for name, proxy, path, body, intended in specs]
        done = threading.Event()
        samples = []
        sampler = threading.Thread(target=lambda: samples.extend(sample_until(
            done, lambda: [inline.proc.pid, callout.proc.pid],
            extra=lambda: envoy_memory(inline.admin) + envoy_memory(callout.admin))))
        sampler.start()
        results = [(job, job.result()) for job in jobs]
        done.set()
        sampler.join()
    finally:
        restarting.stop()
        inline.stop()
        callout.stop()
        for s in servers.values():
            s.stop()
    report("Envoy + filter", results, samples, problems)
    print(f"server restarts: {restarting.restarts}; the 4th sample column is the two Envoys' heap (tcmalloc, kB), "
          "without the V8 heaps they map themselves")


def main():
    problems = []
    logdir = scratch_dir("grpc-wasm-soak-")
    hosts = os.environ.get("SOAK_HOSTS", "nginx envoy").split()
    if "nginx" in hosts:
        soak_nginx(logdir, problems)
    if "envoy" in hosts:
        soak_envoy(logdir, problems)
    if problems:
        print("\nSOAK FAILED:\n" + "\n".join(problems))
        sys.exit(1)
    print("\nsoak passed")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()

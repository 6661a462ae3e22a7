"""grpc.metrics() and grpc.prometheus() in real nginx with two workers, on
both transports: known traffic, then a scrape with exact counts, the
workers' figures added up through the lua_shared_dict the user names."""

import json
import os
import re
import subprocess
import time

import pytest

from harness.nginx import Nginx, Server
from harness.prometheus_text import parse

METRICS_INIT = """
lua_shared_dict grpc_metrics 1m;
init_by_lua_block {
    assert(require("resty.ffi.grpc").init{metrics_dict = "grpc_metrics", metrics_interval = 100})
}
"""
GREETER = (("grpc_method", "SayHello"), ("grpc_service", "helloworld.Greeter"))
FAIL = (("grpc_method", "Fail"), ("grpc_service", "grpcwasm.testing.Testing"))


@pytest.fixture(scope="module")
def servers():
    started = {"greeter": Server("greeter-server"), "testing": Server("testing-server")}
    from harness.paths import PROTOS
    yield {**{name: s.addr for name, s in started.items()}, "protos": PROTOS}
    for s in started.values():
        s.stop()


def scrape_until(proxy, key, expected, timeout=10):
    """The scrape once the other worker's figures (published every 100 ms) are in."""
    deadline = time.time() + timeout
    while True:
        status, text = proxy.get("/t/metrics_scrape")
        assert status == 200, text
        samples, types = parse(text)
        if samples.get(key) == expected or time.time() > deadline:
            return samples, types, text
        time.sleep(0.1)


@pytest.fixture(scope="module")
def resty_ffi_harness(tmp_path_factory):
    out = tmp_path_factory.mktemp("harness")
    subprocess.run(["sh", os.path.join(os.path.dirname(__file__), "..", "resty-ffi", "build.sh"), str(out)],
                   check=True)
    return str(out / "libresty_ffi_harness.so")


@pytest.mark.parametrize(("transport", "mode"), [("cosocket", "ffi"), ("runtime", "ffi"), ("runtime", "resty_ffi")])
def test_prometheus_adds_up_both_workers(servers, transport, mode, request):
    env, init = servers, METRICS_INIT
    if mode == "resty_ffi":
        env = dict(servers, resty_ffi_harness=request.getfixturevalue("resty_ffi_harness"))
        init = METRICS_INIT.replace("init_by_lua_block {", 'init_by_lua_block {\n    require("fake_resty_ffi")')
    proxy = Nginx(env, workers=2, http_extra=init, transport=transport, mode=mode)
    try:
        workers = set()
        for _ in range(12):
            status, body = proxy.get("/t/metrics_traffic")
            assert status == 200, body
            assert "ok: true Hello m!\nfail: NOT_FOUND\nrefused: INVALID_ARGUMENT\n" in body, body
            workers.add(body.split("worker: ")[1].split()[0])
        key = ("grpc_client_handled_total", tuple(sorted((*GREETER, ("grpc_code", "OK")))))
        samples, types, text = scrape_until(proxy, key, 12)
        value = lambda name, *labels: samples.get((name, tuple(sorted(labels))))  # noqa: E731
        assert value("grpc_client_started_total", *GREETER) == 24, text
        assert value("grpc_client_handled_total", *GREETER, ("grpc_code", "OK")) == 12, text
        assert value("grpc_client_handled_total", *GREETER, ("grpc_code", "INVALID_ARGUMENT")) == 12, text
        assert value("grpc_wasm_transcode_failures_total", *GREETER, ("cause", "request")) == 12, text
        assert value("grpc_client_handled_total", *FAIL, ("grpc_code", "NOT_FOUND")) == 12, text
        assert value("grpc_client_msg_sent_total", *GREETER) == 12, text
        assert value("grpc_client_msg_received_total", *GREETER) == 12, text
        # {name: "m"}: 3 bytes of message in a 5-byte frame header.
        assert value("grpc_client_msg_sent_bytes_total", *GREETER) == 12 * 8, text
        assert value("grpc_client_handling_seconds_count", *GREETER) == 24, text
        assert value("grpc_client_handling_seconds_bucket", *GREETER, ("le", "+Inf")) == 24, text
        assert value("grpc_client_handling_seconds_count", *FAIL) == 12, text
        assert types["grpc_client_handling_seconds"] == "histogram"
        assert types["grpc_client_started_total"] == "counter"
        # Gauges are per worker: both workers that served calls have theirs.
        held = {dict(labels)["worker"] for (name, labels) in samples if name == "grpc_wasm_held_bytes"}
        assert held == workers, text
        # grpc.metrics(): this worker's own, as a table.
        status, body = proxy.get("/t/metrics_table")
        assert status == 200, body
        mine = json.loads(body)
        started = [m for m in mine["metrics"] if m["name"] == "grpc_client_started_total"
                   and m["labels"] == {"grpc_service": "helloworld.Greeter", "grpc_method": "SayHello"}]
        assert len(started) == 1, body
        assert started[0]["kind"] == "counter", body
        assert 0 < started[0]["value"] <= 24, body
        hist = next(m for m in mine["metrics"] if m["kind"] == "histogram")
        assert hist["name"] == "grpc_client_handling_milliseconds"
        assert hist["buckets"][-1]["le"] == 30000, body
        assert hist["buckets"][-1]["count"] <= hist["count"], body
    finally:
        proxy.stop()
    # Only the harness's probe of / is an error (no index.html).
    errors = [line for line in proxy.log().splitlines()
              if ("[error]" in line or "[alert]" in line) and "index.html" not in line]
    assert not errors, errors


def test_a_replaced_worker_takes_nothing_from_the_totals(servers):
    """A worker killed and replaced by the master starts counting from zero;
    the totals go on from where they were (a smaller total would read to
    Prometheus as a counter reset)."""
    proxy = Nginx(servers, workers=2, http_extra=METRICS_INIT)
    key = ("grpc_client_handled_total", tuple(sorted((*GREETER, ("grpc_code", "OK")))))
    try:
        pids = set()
        for _ in range(8):
            status, body = proxy.get("/t/metrics_traffic")
            assert status == 200, body
            pids.add(int(body.split("worker: ")[1].split()[1]))
        samples, _, text = scrape_until(proxy, key, 8)
        assert samples.get(key) == 8, text
        for pid in pids:
            os.kill(pid, 9)
        time.sleep(0.5)
        for _ in range(4):
            assert proxy.get("/t/metrics_traffic")[0] == 200
        samples, _, text = scrape_until(proxy, key, 12)
        assert samples.get(key) == 12, text
    finally:
        proxy.stop()


def test_prometheus_without_a_dict_says_what_to_add(servers):
    proxy = Nginx(servers, workers=1)
    try:
        status, body = proxy.get("/t/metrics_scrape")
        assert status == 500
        assert body.startswith("grpc.prometheus needs the name of a lua_shared_dict: "
                               "grpc.init{metrics_dict = \"grpc_metrics\"}"), body
    finally:
        proxy.stop()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PROPAGATE_INIT = """
init_by_lua_block {
    assert(require("resty.ffi.grpc").init{propagate = {"traceparent", "X-Request-Id"}})
}
"""


@pytest.mark.parametrize("transport", ["cosocket", "runtime"])
def test_named_headers_propagate_and_the_user_agent_names_grpc_wasm(servers, transport):
    proxy = Nginx(servers, workers=1, http_extra=PROPAGATE_INIT, transport=transport)
    try:
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/t/propagate",
                                     headers={"traceparent": TRACEPARENT, "x-request-id": "r-1",
                                              "tracestate": "not=named"})
        with urllib.request.urlopen(req, timeout=20) as r:
            metadata = json.loads(r.read())
        assert metadata["traceparent"] == TRACEPARENT, metadata
        assert metadata["x-request-id"] == "r-1", metadata
        assert "tracestate" not in metadata, metadata
        assert re.fullmatch(r"grpc-wasm/\d+\.\d+\.\d+( .*)?", metadata["user-agent"]), metadata
        req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/t/propagate?own=mine",
                                     headers={"x-request-id": "r-2"})
        with urllib.request.urlopen(req, timeout=20) as r:
            assert json.loads(r.read())["x-request-id"] == "mine"
        # init_by_lua checked nothing in the master: a reload must find a
        # replaced liblua_shim.so on disk, not the master's copy.
        with open(f"/proc/{proxy.proc.pid}/maps") as f:
            assert "liblua_shim" not in f.read()
    finally:
        proxy.stop()


def test_a_name_init_by_lua_recorded_is_refused_at_each_workers_first_use(servers):
    init = 'init_by_lua_block { assert(require("resty.ffi.grpc").init{propagate = {"traceparent", "TE"}}) }'
    proxy = Nginx(servers, workers=1, http_extra=init)
    try:
        for _ in range(2):
            status, body = proxy.get("/t/first_use")
            assert (status, body) == (200, "false grpc.init{propagate}: propagate[2]: te is the HTTP/2, gRPC or "
                                           "proxy's own, not metadata a call can carry\n"), body
    finally:
        proxy.stop()


def test_reserved_headers_are_refused_at_init_and_bad_values_left_behind(servers):
    proxy = Nginx(servers, workers=1, http_extra=PROPAGATE_INIT)
    try:
        # The core's rule, as the filter's callout.propagate: accept-encoding
        # is the HTTP exchange's, not the call's.
        for name in ("grpc-trace-bin", "User-Agent", "x-envoy-retry-on", "Accept-Encoding"):
            status, body = proxy.get(f"/t/propagate_refused?name={name}")
            assert status == 200
            assert body == (f"false propagate[1]: {name.lower()} is the HTTP/2, gRPC or proxy's own, "
                            "not metadata a call can carry\n"), body
        status, body = proxy.get("/t/propagate_refused?name=a:b")
        assert body == ("false propagate[1]: invalid metadata key 'a:b': "
                        "only letters, digits, '-', '_' and '.'\n"), body
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/t/propagate",
                                     headers={"traceparent": "caf\u00e9".encode().decode("latin-1"),
                                              "x-request-id": "r-3"})
        with urllib.request.urlopen(req, timeout=20) as r:
            metadata = json.loads(r.read())
        assert "traceparent" not in metadata, metadata
        assert metadata["x-request-id"] == "r-3", metadata
    finally:
        proxy.stop()

"""The filter's metrics in real Envoy: known traffic in transcoding and
callout mode, then Envoy's own /stats/prometheus, whose labels come from the
stats_tags the README gives (harness.STATS_TAGS)."""

import time
import urllib.request

import pytest

from harness.envoy import Envoy, Server, free_port, read_protos
from harness.prometheus_text import parse, value


def scrape(proxy):
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin}/stats/prometheus", timeout=5) as r:
        return parse(r.read().decode())


def post_lines(proxy, path, body):
    """A streamed answer (one JSON message a line)."""
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{path}", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.read().decode().splitlines()


def wait_for_histograms(proxy, name, count, **labels):
    """The scrape once the histogram has `count` samples, and the method's
    counters as many calls: the filter hands its counters over at each
    tick (50 ms), Envoy merges histograms at each stats flush."""
    deadline = time.time() + 10
    while True:
        samples, types = scrape(proxy)
        counted = (value(samples, name + "_count", **labels) == count
                   and value(samples, "grpc_client_started_total", **labels) == count)
        if counted or time.time() > deadline:
            return samples, types
        time.sleep(0.2)


@pytest.fixture(scope="module")
def servers():
    started = {"greeter": Server("greeter-server"), "testing": Server("testing-server")}
    yield started
    for s in started.values():
        s.stop()


GREETER = {"grpc_service": "helloworld.Greeter", "grpc_method": "SayHello"}
FAIL = {"grpc_service": "grpcwasm.testing.Testing", "grpc_method": "Fail"}
STREAM = {"grpc_service": "grpcwasm.testing.Testing", "grpc_method": "StreamThenFail"}


def test_transcoding_counts_calls_by_method_and_code(servers):
    config = {"protos": read_protos("helloworld.proto", "testing.proto")}
    proxy = Envoy(config, [("/helloworld.", "greeter", servers["greeter"].port),
                           ("/", "testing", servers["testing"].port)])
    try:
        for name in ("a", "bb", "ccc"):
            status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": name})
            assert (status, body) == (200, {"message": f"Hello {name}!"}), proxy.log()
        status, _, _ = proxy.post("/helloworld.Greeter/SayHello", b"{not json")
        assert status == 400
        for _ in range(2):
            status, _, _ = proxy.post("/grpcwasm.testing.Testing/Fail", {"code": 5, "message": "gone"})
            assert status == 404
        lines = post_lines(proxy, "/grpcwasm.testing.Testing/StreamThenFail", b'{"count": 3}')
        assert lines == ["{}", '{"index":1}', '{"index":2}'], proxy.log()

        samples, types = wait_for_histograms(proxy, "grpc_client_handling_milliseconds", 4, **GREETER)
        assert value(samples, "grpc_client_started_total", **GREETER) == 4
        assert value(samples, "grpc_client_handled_total", grpc_code="OK", **GREETER) == 3
        assert value(samples, "grpc_client_handled_total", grpc_code="INVALID_ARGUMENT", **GREETER) == 1
        assert value(samples, "grpc_wasm_transcode_failures_total", cause="request", **GREETER) == 1
        # The refused request never left: 3 messages each way. The bytes are
        # the gRPC frames: 5 bytes of header, then {name} (2 + len).
        assert value(samples, "grpc_client_msg_sent_total", **GREETER) == 3
        assert value(samples, "grpc_client_msg_sent_bytes_total", **GREETER) == 3 * 7 + 1 + 2 + 3
        assert value(samples, "grpc_client_msg_received_total", **GREETER) == 3
        assert value(samples, "grpc_client_handled_total", grpc_code="NOT_FOUND", **FAIL) == 2
        assert value(samples, "grpc_wasm_transcode_failures_total", cause="request", **FAIL) is None
        assert value(samples, "grpc_client_msg_received_total", **STREAM) == 3
        assert value(samples, "grpc_client_handled_total", grpc_code="OK", **STREAM) == 1
        assert value(samples, "grpc_client_handling_milliseconds_count", **GREETER) == 4
        assert value(samples, "grpc_client_handling_milliseconds_count", **FAIL) == 2
        assert value(samples, "grpc_wasm_descriptor_files") >= 2
        assert value(samples, "grpc_wasm_held_bytes") == 0
        assert types["grpc_client_handled_total"] == "counter"
        assert types["grpc_client_handling_milliseconds"] == "histogram"
        assert types["grpc_wasm_held_bytes"] == "gauge"
    finally:
        proxy.stop()


def test_callouts_count_their_calls_and_deadlines(servers):
    config = {"protos": read_protos("helloworld.proto", "testing.proto"),
              "callout": {"upstream": "testing", "timeout_ms": 300}}
    proxy = Envoy(config, [("/", "unused", free_port()), (None, "testing", servers["testing"].port)])
    sleep = {"grpc_service": "grpcwasm.testing.Testing", "grpc_method": "Sleep"}
    try:
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/Sleep", {"millis": 1})
        assert status == 200, (body, proxy.log())
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/Sleep", {"millis": 2000})
        assert status == 504, body
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/Fail", {"code": 7})
        assert status == 403, body
        samples, _ = wait_for_histograms(proxy, "grpc_client_handling_milliseconds", 2, **sleep)
        assert value(samples, "grpc_client_started_total", **sleep) == 2
        assert value(samples, "grpc_client_handled_total", grpc_code="OK", **sleep) == 1
        assert value(samples, "grpc_client_handled_total", grpc_code="DEADLINE_EXCEEDED", **sleep) == 1
        assert value(samples, "grpc_client_handled_total", grpc_code="PERMISSION_DENIED", **FAIL) == 1
        assert value(samples, "grpc_client_msg_sent_total", **sleep) == 2
        assert value(samples, "grpc_client_msg_received_total", **sleep) == 1
        assert value(samples, "grpc_wasm_transcode_failures_total", cause="response", **sleep) is None
        # The deadline's call took its 300 ms (Envoy's histograms keep sums
        # to about 1 %).
        assert value(samples, "grpc_client_handling_milliseconds_count", **sleep) == 2
        assert 290 <= value(samples, "grpc_client_handling_milliseconds_sum", **sleep) < 2000
    finally:
        proxy.stop()

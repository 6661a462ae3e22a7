"""What a hostile client or a broken upstream can do to the filter in real
Envoy: each answer is a clear status, and the next request on the same
worker (and the same wasm VM) is served."""

import base64
import http.client
import json
import re
import shutil
import subprocess
import time

import pytest

from harness.envoy import Envoy, Server, free_port, read_protos, validate
from test_callouts import send

NESTING = "message nesting exceeds 100 levels"


@pytest.fixture(scope="module")
def servers():
    started = {"testing": Server("testing-server"), "rogue": Server("rogue-server")}
    yield started
    for s in started.values():
        s.stop()


@pytest.fixture(scope="module")
def envoy(servers):
    config = {"protos": read_protos("testing.proto")}
    proxy = Envoy(config, [("/v1/", "testing", servers["testing"].port),
                           ("/grpcwasm.testing.Testing/Nest", "nest", servers["testing"].port),
                           ("/grpcwasm.testing.Testing/EchoMetadata", "echo", servers["testing"].port),
                           ("/", "rogue", servers["rogue"].port)])
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def callouts(servers):
    config = {"protos": read_protos("testing.proto"),
              "callout": {"upstream": "testing", "timeout_ms": 400, "max_timeout_ms": 500}}
    proxy = Envoy(config, [("/", "unused", free_port()), (None, "testing", servers["testing"].port)])
    yield proxy
    proxy.stop()


def assert_still_serves(proxy):
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/Nest", {"depth": 2})
    assert (status, body) == (200, {"value": {
        "@type": "type.googleapis.com/google.protobuf.Any",
        "value": {"@type": "type.googleapis.com/grpcwasm.testing.Empty"}}}), proxy.log()


def rss_kb(proxy):
    with open(f"/proc/{proxy.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("depth", [101, 5000, 20000])
def test_a_deeply_nested_response_fails_that_call_only(envoy, depth):
    status, body, _ = envoy.post("/grpcwasm.testing.Testing/Nest", {"depth": depth})
    # One answer's headers wait for it, so the error is the HTTP status;
    # those of a message over 64 KiB, which the module carries, leave once
    # its frame header says it fits (Envoy would buffer its JSON whole
    # behind them): the body is the error.
    assert status == (500 if depth == 101 else 200), envoy.log()
    assert body == {"code": 13, "message": f"cannot write grpcwasm.testing.NestReply as JSON: {NESTING}",
                    "details": []}, envoy.log()
    assert_still_serves(envoy)


def test_deeply_nested_error_details_fail_soft(envoy):
    # 900 levels: Envoy's 60 KiB limit on upstream headers holds deeper ones.
    status, body, _ = envoy.post("/grpcwasm.testing.Testing/Nest", {"depth": 900, "inDetails": True})
    assert status == 500, envoy.log()
    assert (body["code"], body["message"]) == (13, "nested details")
    # A detail too deep to print is kept as its type and base64 bytes.
    [detail] = body["details"]
    assert detail["@type"] == "type.googleapis.com/google.protobuf.Any"
    assert isinstance(detail["value"], str)
    assert len(detail["value"]) > 30_000
    assert_still_serves(envoy)


def test_query_field_paths_are_bounded(envoy):
    deep = ".".join(["child"] * 4000) + ".depth"
    status, body, _ = envoy.post(f"/v1/nest/3?{deep}=1", {})
    message = f"query parameter '{deep[:40]}...': field path longer than 1024 bytes"
    assert (status, body) == (400, {"code": 3, "message": message, "details": []}), envoy.log()
    deep = ".".join(["child"] * 150)
    status, body, _ = envoy.post(f"/v1/nest/3?{deep}.depth=1", {})
    message = f"query parameter '{deep[:40]}...': field path deeper than 100 fields"
    assert (status, body) == (400, {"code": 3, "message": message, "details": []}), envoy.log()
    status, body, _ = envoy.post("/v1/nest/2?child.child.depth=1", {})
    assert status == 200, envoy.log()
    assert body["value"]["@type"].endswith("Any"), envoy.log()
    assert_still_serves(envoy)


def test_a_refused_query_is_answered_at_the_headers_before_the_upstream_answers(envoy):
    """Envoy starts the upstream request as soon as the request headers pass
    the filter. The query used to be checked only with the body: a 24 KB
    URL went upstream (rewritten, in x-grpc-wasm-original-path) and the
    server's 431 raced the filter's 400, which a late body always lost
    (500 'HTTP status 431 from a non-gRPC response'; test_query_field_paths
    _are_bounded failed so 1 run in 3)."""
    deep = ".".join(["child"] * 4000) + ".depth"
    conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=10)
    try:
        conn.putrequest("POST", f"/v1/nest/3?{deep}=1")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", "2")
        conn.endheaders()
        time.sleep(0.5)
        conn.send(b"{}")
        response = conn.getresponse()
        answer = (response.status, json.loads(response.read()))
    finally:
        conn.close()
    message = f"query parameter '{deep[:40]}...': field path longer than 1024 bytes"
    assert answer == (400, {"code": 3, "message": message, "details": []})
    assert_still_serves(envoy)


def test_a_gzip_bomb_is_resource_exhausted_and_memory_stays_bounded(envoy):
    # Warm up, so that the VM's ordinary growth is not counted.
    assert_still_serves(envoy)
    before = rss_kb(envoy)
    status, body, _ = envoy.post("/grpcwasm.testing.Testing/Large", {"size": 1}, {"x-rogue": "gzip-bomb"})
    assert status == 413, envoy.log()
    assert body == {"code": 8, "message": "grpc: received messages larger than max in total (limit 4194304 bytes)",
                    "details": []}, envoy.log()
    grown_mb = (rss_kb(envoy) - before) / 1024
    # 300 frames would inflate to 300 MiB; the budget is 4 MiB and its JSON.
    assert grown_mb < 64, f"Envoy grew by {grown_mb:.0f} MiB"
    assert_still_serves(envoy)


def test_a_large_first_message_of_a_stream_keeps_the_rest(servers):
    # Only a unary answer is carried message-first; a stream's array waits
    # for all of its messages.
    config = {"protos": read_protos("testing.proto"), "stream_format": "array"}
    proxy = Envoy(config, [("/", "rogue", servers["rogue"].port)])
    try:
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/StreamThenFail", {},
                                     {"x-rogue": "large-first-of-three"})
        assert (status, body) == (200, [{"index": 1}, {"index": 2}, {"index": 3}]), proxy.log()
    finally:
        proxy.stop()


def test_a_unary_frame_over_the_limit_is_refused_by_its_header(envoy):
    status, body, _ = envoy.post("/grpcwasm.testing.Testing/Large", {"size": 1}, {"x-rogue": "frame-over-limit"})
    assert (status, body) == (413, {"code": 8, "details": [],
                                    "message": "grpc: received message larger than max (104857600 vs. 4194304)"})
    assert_still_serves(envoy)


def h2_post_with_trailers(proxy, path, body, tmp_path):
    """POST `body` over HTTP/2 (nghttp, nghttp2-client) as JSON, ended by
    a trailer: (HTTP status, JSON answer or the raw text)."""
    data = tmp_path / "body"
    data.write_bytes(body)
    out = subprocess.run(["nghttp", "-v", "-d", str(data), "--trailer", "x-any: 1",
                          "-H", "content-type: application/json", f"http://127.0.0.1:{proxy.port}{path}"],
                         capture_output=True, text=True, timeout=30).stdout
    sent = re.search(r"send HEADERS frame <length=\d+, flags=0x05", out)
    assert sent, f"nghttp sent no trailers:\n{out}"
    status = int(re.search(r"recv \(stream_id=\d+\) :status: (\d+)", out).group(1))
    # nghttp writes the body and then, on the same line, its next log entry.
    answer = next((line for line in out.splitlines() if line.startswith("{")), out)
    try:
        return status, json.JSONDecoder().raw_decode(answer)[0]
    except ValueError:
        return status, answer


@pytest.mark.skipif(not shutil.which("nghttp"), reason="nghttp (nghttp2-client) is not installed")
@pytest.mark.parametrize("mode", ["transcoding", "callout"])
def test_a_request_that_ends_with_trailers_is_refused_not_forwarded(envoy, callouts, mode, tmp_path):
    """The filter held a JSON body until a body callback said end of
    stream; a request ended by trailers never said so, and Envoy forwarded
    the client's own bytes upstream as the gRPC request under the path the
    filter had rewritten: a gRPC frame sent as "JSON" was answered 200."""
    proxy = {"transcoding": envoy, "callout": callouts}[mode]
    empty_message = b"\x00\x00\x00\x00\x00"
    status, body = h2_post_with_trailers(proxy, "/grpcwasm.testing.Testing/EchoMetadata", empty_message, tmp_path)
    assert (status, body) == (400, {"code": 3, "details": [], "message": "request trailers are not supported: "
                                    "a JSON request ends with its body"}), (body, proxy.log()[-3000:])
    # The same bytes without trailers are what they are: not JSON.
    status, _, _ = send(proxy, "POST", "/grpcwasm.testing.Testing/EchoMetadata", empty_message)
    assert status == 400, proxy.log()[-3000:]
    if mode == "transcoding":
        assert_still_serves(proxy)


def test_a_message_cut_short_by_the_trailers_fails_in_them(envoy):
    # The message's first bytes have left (nothing is held back), so the
    # error can only be in the trailers, which HTTP/2 clients get.
    out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null",
                          "-H", "content-type: application/json", "-H", "x-rogue: cut-message",
                          "-d", '{"size": 1}', f"http://127.0.0.1:{envoy.port}/grpcwasm.testing.Testing/Large"],
                         capture_output=True, text=True, timeout=20)
    head = out.stdout.lower()
    assert head.startswith("http/2 200"), out
    assert "grpc-status: 13" in head, out
    assert "grpc-message: the upstream ended the response within a message (100005 of 1048581 bytes)" in head, out
    assert_still_serves(envoy)


def test_a_client_cannot_forge_the_original_path(envoy):
    status, body, _ = envoy.post("/grpcwasm.testing.Testing/EchoMetadata", {},
                                 {"x-grpc-wasm-original-path": "/admin/delete-everything"})
    assert status == 200, envoy.log()
    assert "x-grpc-wasm-original-path" not in body["metadata"], body


def test_callout_metadata_never_carries_proxy_controls(callouts):
    status, body, _ = send(callouts, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {},
                           {"grpc-metadata-x-envoy-retry-on": "5xx", "grpc-metadata-user": "ann"})
    assert status == 200, callouts.log()
    assert body["metadata"]["user"] == "ann"
    assert "x-envoy-retry-on" not in body["metadata"], body


def test_a_client_deadline_is_capped_by_max_timeout_ms(callouts):
    started = time.monotonic()
    status, body, _ = send(callouts, "POST", "/grpcwasm.testing.Testing/Sleep", {"millis": 5000},
                           {"grpc-timeout": "9999S"})
    elapsed = time.monotonic() - started
    assert (status, body["code"]) == (504, 4), (body, callouts.log())
    # The server sleeps 5 s; the bound leaves a loaded machine its margin.
    assert elapsed < 4, elapsed


def test_callout_responses_over_the_limit_are_refused(servers):
    config = {"protos": read_protos("testing.proto"), "max_response_bytes": 2000,
              "callout": {"upstream": "testing"}}
    proxy = Envoy(config, [("/", "unused", free_port()), (None, "testing", servers["testing"].port)])
    try:
        status, body, _ = send(proxy, "POST", "/grpcwasm.testing.Testing/Large", {"size": 5000})
        assert (status, body["code"]) == (413, 8), (body, proxy.log())
        assert body["message"] == "response body of 5003 bytes exceeds the limit of 2000 bytes"
    finally:
        proxy.stop()


def test_upstream_header_is_refused_outside_the_shim():
    code, out = validate({"protos": read_protos("testing.proto"),
                          "callout": {"upstream": "testing", "upstream_header": "x-up"}})
    assert code != 0
    assert "grpc-wasm: bad configuration: callout.upstream_header: only for the OpenResty shim" in out, out


def test_bodies_over_envoys_buffer_name_the_setting(servers):
    config = {"protos": read_protos("testing.proto")}
    proxy = Envoy(config, [("/", "testing", servers["testing"].port)])
    try:
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/EchoBytes", {"payload": "A" * 1_400_000})
        assert (status, body["code"]) == (413, 8), (body, proxy.log())
        assert body["message"] == ("the request body exceeds the proxy's buffer limit (in Envoy, "
                                   "per_connection_buffer_limit_bytes, 1 MiB by default); raise it to at least "
                                   "max_request_bytes (4194304)")
        assert_serves_small(proxy)
    finally:
        proxy.stop()


def test_responses_larger_than_envoys_buffer_arrive_whole(servers):
    """Envoy's default buffer (1 MiB) once cut a larger unary response after
    its 200; the module holds the body instead, up to max_response_bytes."""
    config = {"protos": read_protos("testing.proto")}
    proxy = Envoy(config, [("/", "testing", servers["testing"].port)])
    try:
        for size in (1_100_000, 3_000_000):
            status, body, headers = proxy.post("/grpcwasm.testing.Testing/Large", {"size": size})
            assert status == 200, proxy.log()
            assert headers["content-type"] == "application/json"
            assert len(base64.b64decode(body["payload"])) == size, len(body["payload"])
        # Past max_response_bytes: the headers waited for the frame's
        # header, which says so.
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/Large", {"size": 4_200_000})
        assert (status, body["code"]) == (413, 8), (str(body)[:300], proxy.log())
        assert body["message"] == "grpc: received message larger than max (4200005 vs. 4194304)", body
        assert_serves_small(proxy)
    finally:
        proxy.stop()


def test_three_megabytes_both_ways_with_the_documented_buffer_limit(servers):
    config = {"protos": read_protos("testing.proto")}
    # The README's setting: room for max_request_bytes / max_response_bytes
    # (4 MiB) as JSON, whose base64 bytes are a third larger.
    proxy = Envoy(config, [("/", "testing", servers["testing"].port)], buffer_limit=8 << 20)
    try:
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/Large", {"size": 3_000_000})
        assert status == 200, proxy.log()
        assert len(body["payload"]) == 4_000_000
        payload = "QUJD" * 750_000  # 2.25 MB of bytes, 3 MB of JSON
        status, body, _ = proxy.post("/grpcwasm.testing.Testing/EchoBytes", {"payload": payload})
        assert (status, body) == (200, {"payload": payload}), proxy.log()
    finally:
        proxy.stop()


def assert_serves_small(proxy):
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/EchoBytes", {"payload": "QUJD"})
    assert (status, body) == (200, {"payload": "QUJD"}), proxy.log()


@pytest.mark.skipif(not shutil.which("h2load"), reason="h2load (nghttp2-client) is not installed")
def test_a_thousand_streams_declaring_large_messages_do_not_exhaust_the_vm(servers, tmp_path):
    """Each stream's upstream sends a frame header declaring 8 MB and 20 KB
    of it, then waits 3 s: the module reserved the declared size as soon as
    the header arrived, 8 GB for a thousand streams (Envoy's circuit
    breaker lets 1,024 through), and the VM failed ("memory allocation ...
    failed", then 5xx for the rest). It now holds what has arrived."""
    config = {"protos": read_protos("testing.proto"), "max_response_bytes": 8 << 20}
    proxy = Envoy(config, [("/", "rogue", servers["rogue"].port)])
    try:
        body = tmp_path / "body"
        body.write_text('{"size": 1}')
        out = subprocess.run(["h2load", "-n", "1000", "-c", "1", "-m", "1000", "-d", str(body),
                              "-H", "content-type: application/json", "-H", "x-rogue: declared-then-wait",
                              f"http://127.0.0.1:{proxy.port}/grpcwasm.testing.Testing/Large"],
                             capture_output=True, text=True, timeout=120).stdout
        assert "status codes: 1000 2xx, 0 3xx, 0 4xx, 0 5xx" in out, (out, proxy.log()[-3000:])
        assert_serves_small_on(proxy, servers)
        # Each ended within its message, and said so in its trailers. Envoy
        # writes its log file in batches: the count is waited for.
        deadline, cut = time.monotonic() + 30, 0
        while cut < 1000 and time.monotonic() < deadline:
            time.sleep(0.5)
            with open(proxy.log_path) as f:
                log = f.read()
            cut = log.count("the upstream ended the response within a message (20005 of 8000005 bytes)")
        assert cut == 1000, (cut, log[-1000:])
        assert "memory allocation" not in log, log[-3000:]
        assert "unreachable" not in log, log[-3000:]
    finally:
        proxy.stop()


def assert_serves_small_on(proxy, servers):
    # The rogue answers an unknown mode with a trailers-only UNIMPLEMENTED.
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/Large", {"size": 1}, {"x-rogue": "none"})
    assert (status, body) == (501, {"code": 12, "message": "unknown x-rogue mode 'none'", "details": []}), \
        proxy.log()[-2000:]


def test_a_down_upstream_is_unavailable_with_envoys_cause():
    """A transcoded request whose upstream refuses the connection: Envoy
    answers 503 itself, and the client learns why, not only the status."""
    proxy = Envoy({"protos": read_protos("helloworld.proto")}, [("/", "down", free_port())])
    try:
        status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
        assert (status, body["code"]) == (503, 14), body
        cause = "HTTP status 503 from a non-gRPC response: upstream_reset_before_response_started{"
        assert body["message"].startswith(cause), body
        assert "connection_failure" in body["message"], body
    finally:
        proxy.stop()

"""Callout mode in real Envoy: the filter answers JSON requests by calling
the gRPC method itself through proxy_grpc_call / proxy_grpc_stream."""

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.request

import pytest

from harness.envoy import Envoy, Server, free_port, read_protos


@pytest.fixture(scope="module")
def servers():
    started = {"greeter": Server("greeter-server"), "testing": Server("testing-server"),
               "library": Server("library-server"), "routeguide": Server("routeguide-server")}
    yield started
    for s in started.values():
        s.stop()


def callout_envoy(servers, upstream, **callout):
    config = {"protos": read_protos("helloworld.proto", "testing.proto", "library.proto", "route_guide.proto"),
              "callout": {"upstream": upstream, **callout}}
    # The route's cluster must never see these requests: it is a dead port.
    clusters = [("/", "unused", free_port())]
    clusters += [(None, name, s.port) for name, s in servers.items()]
    return Envoy(config, clusters)


@pytest.fixture(scope="module")
def greeter(servers):
    proxy = callout_envoy(servers, "greeter")
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def testing(servers):
    proxy = callout_envoy(servers, "testing", timeout_ms=3000)
    yield proxy
    proxy.stop()


def send(proxy, method, path, body=None, headers=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def test_unary_callout(greeter):
    status, body, headers = send(greeter, "POST", "/helloworld.Greeter/SayHello", {"name": "callout"})
    assert (status, body) == (200, {"message": "Hello callout!"}), greeter.log()
    assert headers["grpc-status"] == "0"


def test_streaming_callout_gathers_the_messages(servers, testing):
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/StreamThenFail", {"count": 3})
    assert (status, body) == (200, [{}, {"index": 1}, {"index": 2}]), testing.log()
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/StreamThenFail",
                           {"count": 1, "code": 9, "message": "stop"})
    assert (status, body) == (400, [{}, {"error": {"code": 9, "message": "stop", "details": []}}]), testing.log()


def test_client_streaming_callout_sends_each_json_message(servers):
    proxy = callout_envoy(servers, "routeguide")
    try:
        points = b"".join(json.dumps({"latitude": 409012345 + i, "longitude": -742567890}).encode() + b"\n"
                          for i in range(3))
        status, body, _ = send(proxy, "POST", "/routeguide.RouteGuide/RecordRoute", points)
        assert status == 200, proxy.log()
        assert body["pointCount"] == 3, body
        assert body["featureCount"] == 1, body
    finally:
        proxy.stop()


def test_bodiless_get_binding_through_a_callout(servers):
    proxy = callout_envoy(servers, "library")
    try:
        status, shelf, _ = send(proxy, "GET", "/v1/shelves/1")
        assert (status, shelf) == (200, {"id": "1", "theme": "theme-1"}), proxy.log()
        status, body, _ = send(proxy, "GET", "/v1/shelves/0")
        assert status == 404, body
        assert body["code"] == 5, body
    finally:
        proxy.stop()


def test_status_details_and_codes(testing):
    status, body, headers = send(testing, "POST", "/grpcwasm.testing.Testing/Fail",
                                 {"code": 5, "message": "no such book", "withDetails": True})
    assert (status, body["code"], body["message"]) == (404, 5, "no such book"), testing.log()
    assert headers["grpc-status"] == "5"
    # The details come from the call's trailers (issue 28, item 7: Envoy
    # hands a failed proxy_grpc_call none, and they were "details": []).
    assert body["details"] == [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TEST_FAILURE",
         "domain": "grpc-wasm.test", "metadata": {"requested_code": "5"}},
        {"@type": "type.googleapis.com/google.rpc.BadRequest",
         "fieldViolations": [{"field": "code", "description": "requested failure"}]},
    ], body


def test_deadline_from_the_request(testing):
    started = time.time()
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/Sleep", {"millis": 5000},
                                 {"grpc-timeout": "300m"})
    elapsed = time.time() - started
    assert status == 504, (body, testing.log())
    assert body["code"] == 4, (body, testing.log())
    assert "{" not in body["message"], body
    # The server sleeps 5 s: the bound leaves a loaded machine its margin.
    assert elapsed < 4, elapsed


def test_default_deadline_on_streams(testing):
    started = time.time()
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/StreamThenFail",
                           {"count": 100, "intervalMillis": 200}, {"grpc-timeout": "500m"})
    assert status in (200, 504), testing.log()
    assert (body[-1] if isinstance(body, list) else {"error": body})["error"]["code"] == 4, body
    # The stream runs 20 s when not ended at its deadline.
    assert time.time() - started < 4


def test_a_request_body_that_stops_short_is_answered_at_its_deadline(testing):
    """A unary call starts once its body is complete. A client that stops
    sending used to hold the request until Envoy's own timeouts (minutes):
    the deadline runs from the request's headers."""
    sock = socket.create_connection(("127.0.0.1", testing.port), timeout=10)
    started = time.time()
    sock.sendall(b"POST /grpcwasm.testing.Testing/Sleep HTTP/1.1\r\nhost: x\r\n"
                 b"content-type: application/json\r\ngrpc-timeout: 500m\r\ncontent-length: 100\r\n\r\n{")
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = json.loads(response.read())
    elapsed = time.time() - started
    sock.close()
    assert (response.status, body["code"], body["message"]) == (504, 4, "deadline of 500 ms exceeded"), body
    # Envoy's own timeouts would hold it for minutes.
    assert 0.45 < elapsed < 5, elapsed


def test_metadata_from_prefixed_headers(testing):
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {},
                           {"grpc-metadata-user": "ann", "grpc-metadata-trace-bin": "AQI="})
    assert status == 200, testing.log()
    assert body["metadata"]["user"] == "ann", body
    assert not any(k.startswith("grpc-metadata") for k in body["metadata"]), body


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_trace_context_and_user_agent_reach_the_upstream(testing):
    """Envoy puts no trace context on the calls a filter makes (envoy#22028):
    the filter carries traceparent and tracestate on, and names itself."""
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {},
                           {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE",
                            "x-request-id": "r-1", "user-agent": "curl/8"})
    assert status == 200, testing.log()
    metadata = body["metadata"]
    assert metadata["traceparent"] == TRACEPARENT, body
    assert metadata["tracestate"] == "congo=t61rcWkgMzE", body
    assert "x-request-id" not in metadata, body
    assert re.fullmatch(r"grpc-wasm/\d+\.\d+\.\d+( .*)?", metadata["user-agent"]), body


def test_configured_headers_propagate_instead(servers):
    proxy = callout_envoy(servers, "testing", propagate=["x-request-id", "b3"])
    try:
        b3 = "80f198ee56343ba8-e457b5a2e4d86bd1-1"
        status, body, _ = send(proxy, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {},
                               {"traceparent": TRACEPARENT, "x-request-id": "r-1", "b3": b3})
        assert status == 200, proxy.log()
        metadata = body["metadata"]
        assert (metadata["x-request-id"], metadata["b3"]) == ("r-1", b3), body
        assert "traceparent" not in metadata, body
    finally:
        proxy.stop()


def test_server_down_is_unavailable(servers):
    proxy = callout_envoy({}, "dead")
    try:
        status, body, _ = send(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": "x"})
        assert (status, body["code"]) == (503, 14), (body, proxy.log())
        assert not body["message"].endswith("}"), body
    finally:
        proxy.stop()


def test_large_message(testing):
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/Large", {"size": 1_000_000})
    assert status == 200, testing.log()
    assert len(body["payload"]) == (1_000_000 + 2) // 3 * 4


def test_bad_json_never_calls(testing):
    status, body, _ = send(testing, "POST", "/grpcwasm.testing.Testing/Sleep", {"millis": "soon"})
    assert (status, body["code"]) == (400, 3), body
    assert body["message"] == "millis: expected an integer, got a string that is not one", body

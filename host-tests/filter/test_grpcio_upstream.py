"""The filter in front of a second gRPC stack: Python grpcio (C-core) running
gRPC's interop TestService (host-tests/interop/interop_server.py), which
gzip-compresses its answers when a request asks, as any server may once the
filter offers gzip in grpc-accept-encoding (issue 27, item 1)."""

import base64
import json

import pytest

from harness.envoy import read_protos, stop_process
from harness.interop import start_interop_server
from harness.nginx import ensure_certs
from test_scenarios import read_lines, request

UNARY = "/grpc.testing.TestService/UnaryCall"
STREAMING = "/grpc.testing.TestService/StreamingOutputCall"


@pytest.fixture(scope="module")
def grpcio():
    proc, ports = start_interop_server(ensure_certs())
    yield ports["plaintext"]
    stop_process(proc)


@pytest.fixture(scope="module")
def proxy(proxy_factory, grpcio):
    return proxy_factory({"protos": read_protos("interop.proto")}, [("/grpc.testing.", "interop", grpcio)])


def payload_size(message):
    return len(base64.b64decode(message["payload"]["body"]))


@pytest.mark.parametrize("size", [1000, 314159])
@pytest.mark.parametrize("compressed", [True, False])
def test_a_unary_answer_compressed_or_not_is_transcoded(proxy, size, compressed):
    # 314159 bytes: over 64 KiB, so the module carries the message itself.
    status, body, headers = request(proxy, "POST", UNARY, {"responseSize": size,
                                                           "responseCompressed": {"value": compressed}})
    assert status == 200, (str(body)[:300], proxy.log()[-3000:])
    assert headers["content-type"] == "application/json"
    assert payload_size(body) == size


def test_a_stream_of_compressed_and_plain_messages_is_transcoded(proxy):
    params = [{"size": 31415, "compressed": {"value": True}}, {"size": 9, "compressed": {"value": False}},
              {"size": 92653, "compressed": {"value": True}}]
    status, content_type, lines = read_lines(proxy, STREAMING, {"responseParameters": params})
    assert (status, content_type) == (200, "application/x-ndjson"), (lines, proxy.log()[-3000:])
    assert [payload_size(json.loads(line)) for _, line in lines] == [31415, 9, 92653]


def test_a_compressed_answer_over_the_limit_is_refused_after_inflating(proxy_factory, grpcio):
    # 300,000 zero bytes compress to a few hundred: the limit holds for
    # what the message inflates to.
    proxy = proxy_factory({"protos": read_protos("interop.proto"), "max_response_bytes": 200_000},
                          [("/grpc.testing.", "interop", grpcio)])
    status, body, _ = request(proxy, "POST", UNARY, {"responseSize": 300_000, "responseCompressed": {"value": True}})
    assert body["code"] == 8, (status, str(body)[:300])
    # Inflating stops one byte past the limit: the size is never inflated
    # whole.
    assert body["message"] == "grpc: received message larger than max (200001 vs. 200000)", body
    status, body, _ = request(proxy, "POST", UNARY, {"responseSize": 1000, "responseCompressed": {"value": True}})
    assert (status, payload_size(body)) == (200, 1000), proxy.log()[-3000:]


# grpcio writes the headers and the first DATA apart, and sends its
# initial metadata before an error when asked to echo some: the filter sees
# the headers before it can know how the answer ends.
ECHO_INITIAL = {"x-grpc-test-echo-initial": "first"}


def test_an_answer_over_the_limit_is_not_a_200(proxy):
    """A 5 MB answer over max_response_bytes (4 MiB) was a 200 whose body
    was the error: the headers had left before the frame header said 5 MB.
    Envoy holds one answer's headers until it is known, as its own
    transcoder does; ngx_wasm_module sends them on at once (a pause there
    asks for a local reply), so only the body can say it."""
    status, body, headers = request(proxy, "POST", UNARY, {"responseSize": 5_000_000})
    if proxy.kind == "ngx_wasm":
        # nginx's buffers are full before the frame is whole.
        expected = (200, "response body of 5000015 bytes exceeds the limit of 4194304 bytes")
    else:
        expected = (413, "grpc: received message larger than max (5000010 vs. 4194304)")
    assert (status, body) == (expected[0], {"code": 8, "message": expected[1], "details": []}), \
        (status, str(body)[:300], proxy.log()[-3000:])
    assert headers["content-type"] == "application/json"


def test_an_error_after_the_headers_is_the_http_status(proxy):
    status, body, _ = request(proxy, "POST", UNARY, {"responseStatus": {"code": 5, "message": "gone"}},
                              ECHO_INITIAL)
    assert body == {"code": 5, "message": "gone", "details": []}, (status, body)
    expected = 200 if proxy.kind == "ngx_wasm" else 404
    assert status == expected, proxy.log()[-3000:]


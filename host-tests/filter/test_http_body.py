"""google.api.HttpBody through bindings (issue 28, item 2), against a grpcio
server (files_server.py): a request body that is not JSON reaches the
upstream raw, with its Content-Type, where the binding's body is an
HttpBody; an HttpBody answer is sent as its bytes with its own
Content-Type (a stream's data one message after another, typed by the
first), whole or named by `response_body`.

ngx_wasm_module sends the response headers before the filter sees the
first message and has no gRPC calls for the filter to make instead, so
there an HttpBody answer stays JSON ({"contentType", "data"}); raw
requests work in both hosts. There a GET reaches the upstream as GET,
which grpcio refuses (see GET_IS_GET)."""

import base64
import http.client
import json
import os
import subprocess
import sys

import pytest

from conftest import not_in
from harness.envoy import read_protos, stop_process

HERE = os.path.dirname(os.path.abspath(__file__))

# nginx's grpc module writes a GET request's :method from the method it
# parsed (ngx_http_grpc_module.c: the indexed GET), whatever a filter sets
# (ngx_wasm_module changes only its name): the upstream sees GET, which
# tonic accepts and grpcio refuses ("Bad method header", RST_STREAM).
GET_IS_GET = "a GET binding reaches the upstream as :method GET (nginx's grpc module), which grpcio refuses"


@pytest.fixture(scope="module")
def files_port():
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "files_server.py")], stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"files_server.py exited with {proc.wait()}")
    yield json.loads(line)["port"]
    stop_process(proc)


@pytest.fixture(scope="module")
def files(proxy_factory, files_port):
    return proxy_factory({"protos": read_protos("files.proto")}, [("/", "files", files_port)])


def exchange(proxy, method, path, body=None, content_type=None):
    """(HTTP status, raw body, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    conn.request(method, path, body, {"content-type": content_type} if content_type else {})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, raw, {k.lower(): v for k, v in response.getheaders()}


def http_body(content_type, data):
    """google.api.HttpBody's protobuf: field 1 the type, field 2 the data."""
    def field(number, value):
        return bytes([number << 3 | 2]) + varint(len(value)) + value
    return field(1, content_type.encode()) + field(2, data)


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7f | 0x80])
        n >>= 7
    return out + bytes([n])


def test_a_raw_request_body_is_the_http_body_the_upstream_gets(files):
    data = bytes(range(256)) * 3
    status, raw, headers = exchange(files, "POST", "/v1/uploads", data, "application/octet-stream")
    assert (status, headers["content-type"]) == (200, "application/json"), (raw[:300], files.log()[-3000:])
    received = base64.b64decode(json.loads(raw)["request"])
    assert received == http_body("application/octet-stream", data)
    # Not JSON at all, and no Content-Type: the bytes still go as they came.
    status, raw, _ = exchange(files, "POST", "/v1/uploads", b"{not json")
    assert status == 200, raw[:300]
    assert base64.b64decode(json.loads(raw)["request"]) == b"\x12\x09{not json"


def test_an_http_body_at_a_dotted_path_takes_the_raw_body(files):
    """`body: "attachment.file"`: Envoy's transcoder reads a dotted path, so
    the filter does too, in both hosts (the rule is the core's)."""
    status, raw, _ = exchange(files, "POST", "/v1/nested/n1", b"a,b\n\xff", "text/csv")
    assert status == 200, (raw[:300], files.log()[-3000:])
    file = http_body("text/csv", b"a,b\n\xff")
    attachment = b"\x0a" + varint(len(file)) + file
    expected = b"\x12" + varint(len(attachment)) + attachment + b"\x0a\x02n1"
    assert base64.b64decode(json.loads(raw)["request"]) == expected


def test_escapes_that_decode_to_no_utf8_are_refused_in_the_path_and_the_query(files):
    """Envoy's own transcoder sends such bytes on in a string field, for the
    upstream to refuse (grpcio: 500 INTERNAL); the filter answers 400."""
    for path, named in [("/v1/nested/a%FFb", "path variable 'name'"),
                        ("/v1/uploads?content_type=%C3", "query parameter 'content_type'")]:
        status, raw, headers = exchange(files, "POST", path, b"x", "text/plain")
        assert (status, headers["content-type"]) == (400, "application/json"), raw[:300]
        assert json.loads(raw)["message"].startswith(f"{named}: its "), raw


def test_a_body_field_takes_the_raw_body_and_the_path_the_rest(files):
    status, raw, headers = exchange(files, "PUT", "/v1/files/notes.txt", b"line 1\nline 2\n", "text/plain")
    if files.kind == "ngx_wasm":
        assert (status, headers["content-type"]) == (200, "application/json"), raw[:300]
        assert json.loads(raw) == {"contentType": "text/plain",
                                   "data": base64.b64encode(b"notes.txt:line 1\nline 2\n").decode()}
        return
    assert (status, headers["content-type"], raw) == (200, "text/plain", b"notes.txt:line 1\nline 2\n"), \
        (raw[:300], files.log()[-3000:])


def test_an_http_body_answer_is_its_bytes_with_its_own_content_type(files):
    not_in(files, "ngx_wasm", GET_IS_GET)
    status, raw, headers = exchange(files, "GET", "/v1/files/readme")
    assert status == 200, (raw[:300], files.log()[-3000:])
    assert (headers["content-type"], raw) == ("text/plain; charset=utf-8", b"hello readme")
    # An HttpBody with nothing set: an empty body (Envoy sends no
    # Content-Type with an empty local reply).
    status, raw, headers = exchange(files, "GET", "/v1/files/empty")
    assert (status, raw, headers["content-length"]) == (200, b"", "0"), raw[:300]
    # A content type that is no header value (here, one that would split
    # an HTTP/1.1 response) is refused, not sent.
    status, raw, headers = exchange(files, "GET", "/v1/files/evil")
    assert (status, headers["content-type"], "set-cookie" in headers) == (500, "application/json", False), raw
    assert json.loads(raw)["message"] == ("cannot transcode google.api.HttpBody: its content_type (32 bytes) is no "
                                          "header value: visible ASCII, at most 1024 bytes"), raw
    # A failure is a JSON error, as for any method.
    status, raw, headers = exchange(files, "GET", "/v1/files/missing")
    assert (status, headers["content-type"]) == (404, "application/json"), raw[:300]
    assert json.loads(raw) == {"code": 5, "message": "no file missing", "details": []}


def test_response_body_naming_an_http_body_field_sends_that_field_raw(files):
    not_in(files, "ngx_wasm", GET_IS_GET)
    status, raw, headers = exchange(files, "GET", "/v1/described/logo")
    assert status == 200, (raw[:300], files.log()[-3000:])
    assert (headers["content-type"], raw) == ("image/svg+xml", b"<svg/>")


def test_a_stream_of_http_bodies_is_their_data_typed_by_the_first(files):
    not_in(files, "ngx_wasm", GET_IS_GET)
    status, raw, headers = exchange(files, "GET", "/v1/downloads/table")
    assert status == 200, (raw[:300], files.log()[-3000:])
    # Gathered (the filter's own call answers with a local reply).
    assert (headers["content-type"], raw) == ("text/csv", b"a,b\n1,2\n\x00\xff\n")
    status, raw, headers = exchange(files, "GET", "/v1/downloads/broken")
    assert (status, headers["content-type"]) == (500, "application/json"), raw[:300]
    assert json.loads(raw)["code"] == 15, raw[:300]

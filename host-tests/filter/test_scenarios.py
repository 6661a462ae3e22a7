"""The filter's transcoding scenarios, one definition run in each host (see
conftest.py): Envoy and nginx + ngx_wasm_module, against the tonic test
servers."""

import base64
import http.client
import json
import threading
import time

import pytest

from conftest import not_in
from harness.envoy import free_port, read_protos

NO_TRAILERS = ("ngx_wasm_module never calls a filter's trailers callback, so a status sent in trailers "
               "after data cannot reach the filter")


@pytest.fixture(scope="module")
def proxy(proxy_factory, servers):
    config = {"protos": read_protos("helloworld.proto", "testing.proto")}
    return proxy_factory(config, [("/helloworld.", "greeter", servers["greeter"].port),
                                  ("/grpcwasm.testing.", "testing", servers["testing"].port)])


@pytest.fixture(scope="module")
def library(proxy_factory, servers):
    return proxy_factory({"protos": read_protos("library.proto")}, [("/", "library", servers["library"].port)])


def request(proxy, method, path, body=None, headers=None):
    """Any method; returns (HTTP status, parsed JSON body or text, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    conn.request(method, path, data, {"content-type": "application/json", **(headers or {})})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    try:
        parsed = json.loads(raw or b"null")
    except ValueError:
        parsed = raw.decode(errors="replace")
    return response.status, parsed, {k.lower(): v for k, v in response.getheaders()}


def read_lines(proxy, path, body, headers=None):
    """POST JSON and read the response line by line: (status, content type,
    [(seconds since the request, line)])."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    started = time.time()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json", **(headers or {})})
    response = conn.getresponse()
    lines = []
    while line := response.readline():
        lines.append((time.time() - started, line.decode()))
    return response.status, response.getheader("content-type"), lines


def test_unary_json_to_grpc_and_back(proxy):
    status, body, headers = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": proxy.kind})
    assert (status, body) == (200, {"message": f"Hello {proxy.kind}!"}), proxy.log()
    assert headers["content-type"] == "application/json"


def test_the_upstream_gets_a_grpc_request(proxy):
    status, body, _ = request(proxy, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {}, {"X-Kept": "yes"})
    assert status == 200, proxy.log()
    seen = body["metadata"]
    assert seen["content-type"] == "application/grpc"
    assert seen["te"] == "trailers"
    # The filter inflates what it transcodes, so it lets servers compress.
    assert seen["grpc-accept-encoding"] == "gzip"
    assert seen["x-kept"] == "yes"
    if proxy.kind == "ngx_wasm":
        # nginx sends the length of what it forwards: the 5-byte gRPC frame.
        assert seen["content-length"] == "5"
    else:
        assert "content-length" not in seen
    # The path was already the gRPC one.
    assert "x-grpc-wasm-original-path" not in seen
    # A query string stays with the original path, not the gRPC one.
    status, body, _ = request(proxy, "POST", "/grpcwasm.testing.Testing/EchoMetadata?trace=1", {})
    assert status == 200, proxy.log()
    assert body["metadata"]["x-grpc-wasm-original-path"] == "/grpcwasm.testing.Testing/EchoMetadata?trace=1"
    # A client cannot pass its own original path off as the filter's.
    status, body, _ = request(proxy, "POST", "/grpcwasm.testing.Testing/EchoMetadata", {},
                              {"x-grpc-wasm-original-path": "/forged"})
    if proxy.kind == "ngx_wasm":
        # nginx forwards every copy of a header, removed ones included: the
        # filter refuses the request instead.
        assert (status, body) == (400, {"code": 3, "details": [], "message":
                                         "x-grpc-wasm-original-path is set by the filter, not by clients"}), body
    else:
        assert status == 200, body
        assert "x-grpc-wasm-original-path" not in body["metadata"], body


def test_empty_object_is_the_empty_message(proxy):
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", {})
    assert (status, body) == (200, {"message": "Hello !"}), proxy.log()


def test_error_with_details_maps_the_http_status(proxy):
    status, body, headers = request(proxy, "POST", "/grpcwasm.testing.Testing/Fail",
                                    {"code": 5, "message": "no such book", "withDetails": True})
    assert status == 404, proxy.log()
    assert headers["content-type"] == "application/json"
    assert headers["grpc-status"] == "5"
    assert body["code"] == 5
    assert body["message"] == "no such book"
    assert body["details"][0] == {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TEST_FAILURE",
                                  "domain": "grpc-wasm.test", "metadata": {"requested_code": "5"}}
    assert body["details"][1] == {"@type": "type.googleapis.com/google.rpc.BadRequest",
                                  "fieldViolations": [{"field": "code", "description": "requested failure"}]}


def test_bad_json_is_400_with_the_field_path(proxy):
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": 5})
    assert (status, body) == (400, {"code": 3, "message": "name: expected string, got number", "details": []})
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", b"{not json")
    assert status == 400, body
    assert body["message"].startswith("invalid JSON: key must be a string"), body


def test_unknown_method_is_404_and_unimplemented(proxy):
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayBye", {})
    assert (status, body) == (404, {"code": 12, "message": "unknown method '/helloworld.Greeter/SayBye'",
                                    "details": []})


def test_requests_for_no_method_get_the_filters_404_whatever_their_method(proxy):
    # Envoy sent these to the upstream, which answered 503 (issue 28, item 5).
    for method, path in [("GET", "/v1/nowhere"), ("DELETE", "/helloworld.Greeter/SayHello"), ("POST", "/upload")]:
        status, body, headers = request(proxy, method, path, {} if method == "POST" else None)
        assert (status, body) == (404, {"code": 5, "message": f"no method is bound to {method} {path}",
                                        "details": []}), (method, path, proxy.log()[-2000:])
        assert headers["content-type"] == "application/json"


def test_server_streaming_is_sent_message_by_message(proxy):
    status, ctype, lines = read_lines(proxy, "/grpcwasm.testing.Testing/StreamThenFail",
                                      {"count": 3, "intervalMillis": 400})
    assert (status, ctype) == (200, "application/x-ndjson"), proxy.log()
    assert [line for _, line in lines] == ['{}\n', '{"index":1}\n', '{"index":2}\n']
    # The first message is out long before the last one exists (the
    # server spaces them 400 ms apart; a proxy that held the stream would
    # give them together).
    assert lines[2][0] - lines[0][0] >= 0.6, lines
    assert lines[2][0] >= 0.75, lines


def test_server_streaming_as_server_sent_events(proxy_factory, servers):
    config = {"protos": read_protos("testing.proto"), "stream_format": "sse"}
    proxy = proxy_factory(config, [("/", "testing", servers["testing"].port)])
    status, ctype, lines = read_lines(proxy, "/grpcwasm.testing.Testing/StreamThenFail", {"count": 2})
    assert (status, ctype) == (200, "text/event-stream"), proxy.log()
    assert "".join(line for _, line in lines) == 'data: {}\n\ndata: {"index":1}\n\n'


@pytest.fixture(scope="module")
def proxy_array(proxy_factory, servers):
    config = {"protos": read_protos("testing.proto"), "stream_format": "array"}
    return proxy_factory(config, [("/", "testing", servers["testing"].port)])


def test_server_streaming_as_one_array(proxy_array):
    status, body, headers = request(proxy_array, "POST", "/grpcwasm.testing.Testing/StreamThenFail", {"count": 3})
    assert (status, body) == (200, [{}, {"index": 1}, {"index": 2}]), proxy_array.log()
    assert headers["content-type"] == "application/json"


def test_error_after_streamed_messages(proxy_array):
    not_in(proxy_array, "ngx_wasm", NO_TRAILERS)
    # The array is one answer: its headers wait for its end, whose error
    # ends the array and gives the HTTP status.
    status, body, _ = request(proxy_array, "POST", "/grpcwasm.testing.Testing/StreamThenFail",
                              {"count": 2, "code": 9, "message": "stop"})
    assert (status, body) == (400, [{}, {"index": 1}, {"error": {"code": 9, "message": "stop", "details": []}}]), \
        proxy_array.log()


def test_error_before_any_message_maps_the_http_status(proxy_array):
    not_in(proxy_array, "ngx_wasm", NO_TRAILERS)
    # The upstream sends headers, then only trailers: Envoy holds the
    # headers, and the status is a local reply (no body to write it into).
    status, body, _ = request(proxy_array, "POST", "/grpcwasm.testing.Testing/StreamThenFail",
                              {"count": 0, "code": 7, "message": "denied"})
    assert (status, body) == (403, {"code": 7, "message": "denied", "details": []})


def test_native_grpc_passes_through(proxy):
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
        call = channel.unary_unary("/helloworld.Greeter/SayHello")
        reply = call(b"\x0a\x04grpc", timeout=10)
    assert reply == b"\x0a\x0bHello grpc!"


def test_upstream_down_is_503_unavailable(proxy_factory):
    proxy = proxy_factory({"protos": read_protos("helloworld.proto")}, [("/", "dead", free_port())])
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, body["code"]) == (503, 14), (body, proxy.log())


def test_oversize_bodies_are_413(proxy_factory, servers):
    config = {"protos": read_protos("helloworld.proto", "testing.proto"), "max_request_bytes": 1000,
              "max_response_bytes": 2000}
    proxy = proxy_factory(config, [("/helloworld.", "greeter", servers["greeter"].port),
                                   ("/grpcwasm.testing.", "testing", servers["testing"].port)])
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": "x" * 2000})
    assert (status, body["code"]) == (413, 8), (body, proxy.log())
    assert body["message"].startswith("request body of 2")
    assert body["message"].endswith("exceeds the limit of 1000 bytes")
    status, body, _ = request(proxy, "POST", "/grpcwasm.testing.Testing/Large", {"size": 5000})
    # Envoy holds the headers until the body shows its size; on
    # ngx_wasm_module the 200 has left by then: the body says why.
    assert status == (200 if proxy.kind == "ngx_wasm" else 413), proxy.log()
    assert body["code"] == 8, body
    assert "exceeds the limit of 2000 bytes" in body["message"], body


def test_a_megabyte_each_way(proxy):
    payload = bytes(range(256)) * 4096  # 1 MiB
    encoded = base64.b64encode(payload).decode()
    status, body, _ = request(proxy, "POST", "/grpcwasm.testing.Testing/EchoBytes", {"payload": encoded})
    assert status == 200, (str(body)[:300], proxy.log())
    assert body == {"payload": encoded}


def test_http_bindings_with_bodies(library):
    # body: "*" on POST /v1/shelves
    assert request(library, "POST", "/v1/shelves", {"id": "5", "theme": "sf"})[:2] == \
        (200, {"id": "5", "theme": "sf"}), library.log()
    # body: "book" with a path variable
    status, book, _ = request(library, "POST", "/v1/shelves/1/books", {"title": "Dune", "author": "Herbert"})
    assert status == 200, library.log()
    assert book["title"] == "Dune", library.log()
    assert book["name"].startswith("shelves/1/books/"), library.log()
    name = book["name"]
    # PATCH with a nested path variable, a body field and a query parameter
    status, book, _ = request(library, "PATCH", f"/v1/{name}?updateMask=title", {"title": "Dune Messiah"})
    assert (status, book["title"], book["name"]) == (200, "Dune Messiah", name), library.log()
    # a custom verb
    status, moved, _ = request(library, "POST", f"/v1/{name}:move", {"otherShelf": "2"})
    assert (status, moved["title"]) == (200, "Dune Messiah"), library.log()
    assert moved["name"].startswith("shelves/2/books/moved-")


def test_bindings_take_a_trailing_slash_and_an_unregistered_verb_as_envoy_does(library):
    # Both were unknown paths (404) before issue 28, item 6.
    assert request(library, "POST", "/v1/shelves/", {"id": "6", "theme": "slash"})[:2] == \
        (200, {"id": "6", "theme": "slash"}), library.log()
    # ':frob' is no verb any binding registers: it is part of the book's
    # name, which reaches the server (before: no binding matched).
    status, body, _ = request(library, "PATCH", "/v1/shelves/1/books/2:frob?updateMask=title", {"title": "x"})
    assert (status, body) == (404, {"code": 5, "message": "no book shelves/1/books/2:frob", "details": []}), \
        (body, library.log())


def test_http_binding_errors(library):
    status, body, _ = request(library, "PATCH", "/v1/shelves/1/books/404?updateMask=title", {"title": "x"})
    assert (status, body) == (404, {"code": 5, "message": "no book shelves/1/books/404", "details": []})
    status, body, _ = request(library, "POST", "/v1/shelves/1/books", {"pages": "many"})
    assert status == 400, body
    assert body["message"] == "book.pages: expected an integer, got a string that is not one", body


def titles(body):
    """The titles of a stream of books: a JSON array, or NDJSON lines."""
    if isinstance(body, str):
        body = [json.loads(line) for line in body.splitlines() if line.strip()]
    elif isinstance(body, dict):
        body = [body]
    return [book["title"] for book in body]


def test_bodiless_bindings_take_their_fields_from_the_path_and_query(library):
    """A GET, a DELETE, a custom verb: no body, every field from the request
    line (issue 28, item 1; 501 before). ngx_wasm_module lets the filter
    give the request its gRPC body from the headers callback; Envoy lets no
    filter add a body, so the filter calls the route's own cluster itself."""
    status, body, _ = request(library, "GET", "/v1/shelves/7")
    assert (status, body) == (200, {"id": "7", "theme": "theme-7"}), (body, library.log()[-3000:])
    status, body, _ = request(library, "GET", "/v1/shelves/0")
    assert (status, body) == (404, {"code": 5, "message": "no shelf 0", "details": []}), body
    # A shelf of each host's own: the server is shared.
    shelf = f"/v1/shelves/{31 if library.kind == 'envoy' else 32}"
    for title in ("first", "second"):
        status, body, _ = request(library, "POST", f"{shelf}/books", {"title": title})
        assert status == 200, body
    status, body, _ = request(library, "GET", f"{shelf}/books?page.size=1")
    assert (status, titles(body["books"])) == (200, ["first"]), body
    status, body, _ = request(library, "GET", f"{shelf}/books:stream")
    assert (status, titles(body)) == (200, ["first", "second"]), (body, library.log()[-3000:])
    status, body, _ = request(library, "DELETE", f"{shelf}/books/1")
    assert (status, body) == (200, {}), body
    status, body, _ = request(library, "GET", f"{shelf}/books/1")
    assert (status, body["code"]) == (404, 5), body


@pytest.mark.parametrize(("spec", "found"), [(None, "%3A"), ("ALL_CHARACTERS_EXCEPT_SLASH", ":"),
                                         ("ALL_CHARACTERS", ":")])
def test_a_wildcard_of_several_segments_unescapes_as_envoys_url_unescape_spec(proxy_factory, servers, spec, found):
    """`{query=**}` keeps the escapes of RFC 6570's reserved characters by
    default (Envoy's ALL_CHARACTERS_EXCEPT_RESERVED; `%3A` stayed only if it
    was `%2F` before), and `url_unescape_spec` chooses otherwise."""
    config = {"protos": read_protos("library.proto")}
    if spec:
        config["url_unescape_spec"] = spec
    library = proxy_factory(config, [("/", "library", servers["library"].port)])
    shelf = f"/v1/shelves/{41 if library.kind == 'envoy' else 42}"
    tag = f"{library.kind}-{spec}"
    for title in (f"{tag}/a%3Ab", f"{tag}/a:b"):
        status, body, _ = request(library, "POST", f"{shelf}/books", {"title": title})
        assert status == 200, (body, library.log()[-3000:])
    status, body, _ = request(library, "GET", f"/v1/search/{tag}/a%3Ab")
    assert (status, titles(body)) == (200, [f"{tag}/a{found}b"]), (body, library.log()[-3000:])


def test_two_hundred_concurrent_requests(proxy):
    results = [None] * 200
    start = threading.Barrier(200)

    def worker(i):
        start.wait()
        try:
            results[i] = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": str(i)})[:2]
        except OSError as e:
            results[i] = repr(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(i, r) for i, r in enumerate(results) if r != (200, {"message": f"Hello {i}!"})]
    assert failed == [], (failed[:5], proxy.log())
    log = proxy.log()
    for bad in ("[alert]", "[crit]", "[emerg]", "exited on signal", "[critical]"):
        assert bad not in log, log


def test_a_stream_that_fails_before_its_first_message_is_not_an_empty_200(proxy_factory, servers):
    """tonic sends a stream's headers at once and its error in trailers.
    Envoy holds a stream's headers until its first message, so the status
    is the HTTP status (a local reply, as for a trailers-only error);
    ngx_wasm_module sends the headers on and hands over no trailers: the
    body was empty, and now ends with the error nginx keeps in
    $upstream_trailer_grpc_status."""
    proxy = proxy_factory({"protos": read_protos("testing.proto")},
                          [("/grpcwasm.testing.", "testing", servers["testing"].port)])
    status, content_type, lines = read_lines(proxy, "/grpcwasm.testing.Testing/StreamThenFail",
                                             {"count": 0, "code": 5, "message": "gone"})
    text = "".join(line for _, line in lines)
    error = {"code": 5, "message": "gone", "details": []}
    if proxy.kind == "ngx_wasm":
        assert (status, content_type) == (200, "application/x-ndjson"), (text, proxy.log()[-3000:])
        assert json.loads(text) == {"error": error}, text
    else:
        assert (status, content_type) == (404, "application/json"), (text, proxy.log()[-3000:])
        assert json.loads(text) == error, text

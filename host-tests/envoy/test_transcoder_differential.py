"""The filter against Envoy's native grpc_json_transcoder (issue 28): one
Envoy, two listeners on the same routes to the same upstream, one with each
filter; every case is sent to both, and the suite compares the HTTP status,
the Content-Type, the body (as a JSON value, or raw bytes) and what the
upstream received (the gRPC method and each request message).

The upstream (shelves_server.py, grpcio) records each call under the case
and listener its request came from (the x-case and x-via headers, which
both filters forward as metadata). The descriptor set both filters read is
compiled by protoc.

A case whose answers differ fails unless DIFFERENCES lists it with its
reason; a listed case that no longer differs fails too, so the list stays
true. The README's table "Coming from Envoy's grpc_json_transcoder" gives
the same differences. One kind is compared loosely, as a class: where
Envoy answers its own error as text/plain, the filter answers the same
HTTP status with a google.rpc.Status JSON body (the README's deliberate
difference); the count of those is printed with the summary."""

import base64
import contextlib
import http.client
import json
import urllib.parse

import pytest
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from openapi_spec_validator import validate as validate_spec

from harness.envoy import Envoy, scratch_dir, wasm_filter
from harness.shelves_server import SERVICE, ShelvesServer, descriptor_set

Q = urllib.parse.quote

# (case id, HTTP method, path, body, content type); a body that is not
# bytes is sent as its JSON.
CASES = [
    ("list-shelves", "GET", "/shelves", None, None),
    ("get-shelf", "GET", "/shelves/1", None, None),
    ("get-shelf-int64-max", "GET", "/shelves/9223372036854775807", None, None),
    ("get-shelf-negative", "GET", "/shelves/-3", None, None),
    ("get-shelf-not-a-number", "GET", "/shelves/abc", None, None),
    ("get-shelf-not-found", "GET", "/shelves/404", None, None),
    ("get-shelf-trailing-slash", "GET", "/shelves/1/", None, None),
    ("list-shelves-trailing-slash", "GET", "/shelves/", None, None),
    ("get-shelf-query-sets-field", "GET", "/shelves/1?shelf=2", None, None),
    # Overlapping templates: Envoy's matcher, not the order of declaration.
    ("literal-before-variable", "GET", "/shelves/public", None, None),
    ("single-before-multi", "GET", "/files/a/latest", None, None),
    ("multi-beside-single", "GET", "/files/a/b/latest", None, None),
    ("empty-segment-is-single", "GET", "/files//latest", None, None),
    ("trailing-slashes", "GET", "/shelves/1//", None, None),
    ("bound-twice", "GET", "/twins/1", None, None),
    ("exact-method-before-any", "GET", "/any/1", None, None),
    ("any-method-delete", "DELETE", "/any/1", None, None),
    ("any-method-post", "POST", "/any/1", b"", "application/json"),
    ("any-method-with-a-verb", "POST", "/any/1:archive", None, None),
    ("literal-verb-vs-variable", "POST", "/shelves/public:archive", None, None),
    ("delete-shelf", "DELETE", "/shelves/1", None, None),
    ("archive-shelf-bodiless-post", "POST", "/shelves/1:archive", None, None),
    ("archive-shelf-empty-json-body", "POST", "/shelves/1:archive", b"", "application/json"),
    ("create-shelf", "POST", "/shelves", {"id": "5", "theme": "Sci-fi", "genre": "FICTION"}, "application/json"),
    ("create-shelf-enum-number", "POST", "/shelves", {"theme": "x", "genre": 2}, "application/json"),
    ("create-shelf-int64-number", "POST", "/shelves", {"id": 9007199254740993}, "application/json"),
    ("create-shelf-no-content-type", "POST", "/shelves", {"theme": "x"}, None),
    ("query-name-decoded", "POST", "/shelves?shelf.search%5Bdecoded%5D=Google", {"theme": "x"}, "application/json"),
    ("query-name-unescaped", "POST", "/shelves?shelf.search[decoded]=Google", {"theme": "x"}, "application/json"),
    ("query-name-as-sent", "POST", "/shelves?shelf.search%5Bencoded%5D=Google", {"theme": "x"}, "application/json"),
    ("query-name-not-decoded", "POST", "/shelves?shelf.search[encoded]=Google", {"theme": "x"}, "application/json"),
    ("query-name-dot-escaped", "POST", "/shelves?shelf%2Etheme=y", {"theme": "x"}, "application/json"),
    ("create-shelf-text-plain", "POST", "/shelves", {"theme": "x"}, "text/plain"),
    ("create-shelf-bad-json", "POST", "/shelves", b"{oops", "application/json"),
    ("create-shelf-unknown-field", "POST", "/shelves", {"nope": 1}, "application/json"),
    ("create-shelf-bad-enum", "POST", "/shelves", {"genre": "NOPE"}, "application/json"),
    ("create-shelf-empty-body", "POST", "/shelves", b"", "application/json"),
    ("create-book", "POST", "/shelves/1/books",
     {"title": "Dune", "author": "Herbert", "pages": 412, "tags": ["a", "b"],
      "published": "1965-08-01T00:00:00Z"}, "application/json"),
    ("update-book-patch", "PATCH", "/shelves/1/books/7", {"title": "New"}, "application/json"),
    ("put-book-body-star", "PUT", "/shelves/1/books/7", {"book": {"title": "x"}}, "application/json"),
    ("put-book-body-and-path-collide", "PUT", "/shelves/1/books/7", {"shelf": "2", "book": {"title": "x"}},
     "application/json"),
    ("get-book", "GET", "/shelves/1/books/2", None, None),
    ("get-book-additional-binding", "GET", "/v2/shelves/1/books/2", None, None),
    ("search-scalars", "GET", "/search?query=q&limit=-5&offset=18446744073709551615&exact=true&score=1.5", None,
     None),
    ("search-nested", "GET", "/search?filter.author=Le%20Guin&filter.year=1969&filter.genre=FICTION", None, None),
    ("search-repeated", "GET", "/search?years=1&years=2&tags=a&tags=b", None, None),
    ("search-repeated-enum", "GET", "/search?genres=POETRY&genres=1", None, None),
    ("search-json-name", "GET", "/search?sortBy=asc", None, None),
    ("search-proto-name-with-json-name", "GET", "/search?sort_order=asc", None, None),
    ("search-camel-case", "GET", "/search?pageToken=t", None, None),
    ("search-proto-name", "GET", "/search?page_token=t", None, None),
    ("search-percent-encoded-key", "GET", "/search?sort%42y=asc", None, None),
    ("search-bytes", "GET", "/search?cursor=AQI", None, None),
    ("search-wrapper", "GET", "/search?min_pages=3", None, None),
    ("search-float", "GET", "/search?ratio=0.25", None, None),
    ("search-plus", "GET", "/search?query=a+b", None, None),
    ("search-percent", "GET", "/search?query=a%20b%2Bc%26d", None, None),
    ("search-empty-value", "GET", "/search?query=", None, None),
    ("search-unknown-parameter", "GET", "/search?nope=1", None, None),
    # A parameter with no '=' or no name sets nothing.
    ("search-name-without-value", "GET", "/search?tags", None, None),
    ("search-bool-without-value", "GET", "/search?exact&limit=2", None, None),
    ("search-value-without-name", "GET", "/search?=x", None, None),
    ("get-shelf-name-without-value", "GET", "/shelves/1?shelf", None, None),
    ("search-bad-enum", "GET", "/search?filter.genre=NOPE", None, None),
    ("search-bad-int", "GET", "/search?limit=x", None, None),
    ("search-path-variables", "GET", "/search/Tolkien/1954", None, None),
    ("search-post-body-star", "POST", "/search", {"query": "q", "filter": {"year": 1}}, "application/json"),
    ("search-post-body-and-query", "POST", "/search?limit=3", {"query": "q"}, "application/json"),
    ("search-post-field-body", "POST", "/search/q", {"author": "x", "year": 2}, "application/json"),
    ("lookup-double-star", "GET", "/files/a/b/c.txt", None, None),
    ("lookup-encoded-slash", "GET", "/files/a%2Fb", None, None),
    ("lookup-reserved-escapes", "GET", "/files/a%3Ab%40c", None, None),
    ("lookup-unreserved-escapes", "GET", "/files/a%20b%7E", None, None),
    ("lookup-one-segment-escapes", "GET", "/one/a%3Ab%2Fc", None, None),
    ("lookup-docs-pattern", "GET", "/docs/docs/readme/raw", None, None),
    ("lookup-unregistered-verb", "GET", "/one/file:v2", None, None),
    ("fail-with-details", "GET", "/fail/9?details=true", None, None),
    ("fail-with-message", "GET", "/fail/3?message=bad%20shelf", None, None),
    *[(f"fail-code-{code}", "GET", f"/fail/{code}", None, None) for code in range(1, 17)],
    ("stream-books", "GET", "/shelves/1/books?count=3", None, None),
    ("stream-no-books", "GET", "/shelves/1/books?count=0", None, None),
    ("stream-fails-after-books", "GET", "/shelves/1/books?count=2&fail=true", None, None),
    ("stream-fails-first", "GET", "/shelves/1/books?count=0&fail=true", None, None),
    ("client-stream-json-array", "POST", "/bulk", [{"title": "a"}, {"title": "b"}], "application/json"),
    ("client-stream-ndjson", "POST", "/bulk", b'{"title":"a"}\n{"title":"b"}\n', "application/json"),
    ("client-stream-trailing-comma", "POST", "/bulk", b'[ {"title":"a"},\n {"title":"b"},\n]', "application/json"),
    ("bidi-stream-json-array", "POST", "/chat", [{"title": "a"}, {"title": "b"}], "application/json"),
    ("upload-raw-body", "POST", "/upload", bytes(range(256)), "application/octet-stream"),
    ("download-http-body", "GET", "/download/1", None, None),
    # body and response_body at a dotted path (Envoy's UnaryEchoHttpBody,
    # TranscodingUnaryPostWithHttpBody and EchoResponseBodyPath).
    ("nested-http-body-upload", "POST", "/nested/n1/upload?attachment.note.stars=2", b"a,b\n\xff",
     "text/csv"),
    ("nested-http-body-download", "GET", "/nested/4/download", None, None),
    ("nested-json-body", "POST", "/nested/n1/note", {"text": "hi", "stars": 3}, "application/json"),
    ("nested-json-body-empty", "POST", "/nested/n1/note", b"", "application/json"),
    # Query parameters beside a `*` body (Envoy: the body wins where both
    # set a field; a repeated field gets both).
    ("search-body-star-query-collides", "POST", "/search?query=q&limit=5", {"query": "b"}, "application/json"),
    ("search-body-star-query-repeated", "POST", "/search?tags=q1&tags=q2", {"tags": ["b1"]}, "application/json"),
    ("create-book-body-field-query-collides", "POST", "/shelves/1/books?book.title=q&book.pages=9",
     {"title": "b"}, "application/json"),
    ("search-body-star-query-nested", "POST", "/search?filter.author=qa", {"filter": {"year": 1999}},
     "application/json"),
    # Escapes that decode to no UTF-8, in a string path variable and a
    # string query parameter.
    ("lookup-invalid-utf8", "GET", "/one/a%FFb", None, None),
    ("search-invalid-utf8", "GET", "/search?query=a%FF", None, None),
    ("download-fails", "GET", "/download/404", None, None),
    ("response-body-http-body", "GET", "/cover/1", None, None),
    ("unknown-path-get", "GET", "/nope", None, None),
    ("unknown-path-post", "POST", "/nope", {}, "application/json"),
    ("unbound-method-put", "PUT", "/shelves", {}, "application/json"),
    ("grpc-method-path", "POST", f"/{SERVICE}/GetShelf", {"shelf": "1"}, "application/json"),
    # A method without a binding is auto-mapped: its literal path outranks
    # any template (here PingAnywhere's "/{path}/Ping").
    ("auto-mapped-method-before-template", "POST", f"/{SERVICE}/Ping", {"shelf": "1"}, "application/json"),
    ("template-for-another-service", "POST", "/other.Service/Ping", {}, "application/json"),
    ("auto-mapped-method-trailing-slash", "POST", f"/{SERVICE}/Ping/", {"shelf": "2"}, "application/json"),
]

# The options of item 8 that change answers, each in its own Envoy: Envoy's
# option names, given to both filters alike, and the cases they touch.
OPTIONS = {
    "defaults": ({}, [c[0] for c in CASES]),
    "print-options": ({"print_options": {"preserve_proto_field_names": True,
                                         "always_print_primitive_fields": True,
                                         "always_print_enums_as_ints": True}},
                      ["list-shelves", "get-shelf", "get-book", "create-book", "search-scalars", "search-nested",
                       "search-repeated-enum", "search-json-name", "search-wrapper", "stream-books",
                       "fail-with-details", "client-stream-json-array", "response-body-http-body"]),
    "unescape-options": ({"url_unescape_spec": "ALL_CHARACTERS", "query_param_unescape_plus": True},
                         ["search-plus", "search-percent", "lookup-double-star", "lookup-encoded-slash",
                          "lookup-reserved-escapes", "lookup-unreserved-escapes", "lookup-one-segment-escapes",
                          "lookup-docs-pattern"]),
    "body-limits": ({"max_request_body_size": 100, "max_response_body_size": 100},
                    ["get-shelf", "create-shelf", "create-book", "list-shelves", "stream-books", "upload-raw-body",
                     "download-http-body"]),
    "ndjson-streams": ({"print_options": {"stream_newline_delimited": True}},
                       ["stream-books", "stream-no-books", "stream-fails-after-books", "stream-fails-first",
                        "bidi-stream-json-array"]),
    "sse-streams": ({"print_options": {"stream_sse_style_delimited": True}},
                    ["stream-books", "stream-no-books", "stream-fails-after-books", "stream-fails-first"]),
}

# Where the two answer differently on purpose, or where this filter cannot
# do what Envoy does: (options, case id) -> why. Each is in the README's
# table "Coming from Envoy's grpc_json_transcoder".
DIFFERENCES = {
    ("defaults", "create-shelf-unknown-field"):
        "an unknown JSON field is a 400 unless ignore_unknown_fields; Envoy drops it and calls the method",
    ("defaults", "put-book-body-and-path-collide"):
        "where the body and the path set one field, the path wins (what a route rule or RBAC checked on the "
        "path is what the upstream gets); in Envoy the body wins",
    ("defaults", "stream-fails-after-books"):
        "a stream that fails after messages ends its array with {\"error\": ...} and, gathered, answers the "
        "error's HTTP status; Envoy answers 200 and an array that looks complete",
    ("defaults", "client-stream-ndjson"):
        "a client stream also reads newline-delimited JSON messages (as a callout does); Envoy only an array",
    ("defaults", "get-shelf-query-sets-field"):
        "a query parameter that sets a field the path binds is a 400: a rule that checked the path (RBAC, a "
        "route) checked what the upstream gets; Envoy lets the query replace it",
    ("ndjson-streams", "stream-books"):
        "newline-delimited JSON is sent as application/x-ndjson; Envoy calls it application/json",
    ("ndjson-streams", "bidi-stream-json-array"):
        "newline-delimited JSON is sent as application/x-ndjson; Envoy calls it application/json",
    ("ndjson-streams", "stream-no-books"):
        "Envoy sends no Content-Type with an empty local reply (the filter's own call answers a bodiless "
        "GET); its transcoder's streamed answer has one",
    ("sse-streams", "stream-no-books"):
        "Envoy sends no Content-Type with an empty local reply (the filter's own call answers a bodiless "
        "GET); its transcoder's streamed answer has one",
    ("ndjson-streams", "stream-fails-after-books"):
        "a stream that fails after messages ends with an {\"error\": ...} line and, gathered, answers the "
        "error's HTTP status; Envoy answers 200 and lines that look complete",
    ("sse-streams", "stream-fails-after-books"):
        "a stream that fails after messages ends with an error event and, gathered, answers the error's "
        "HTTP status; Envoy answers 200 and events that look complete",
    ("defaults", "lookup-invalid-utf8"):
        "escapes that decode to bytes that are not UTF-8 are a 400 naming the path variable; Envoy puts the "
        "bytes in the string field, and the upstream refuses the message (grpcio: 500 INTERNAL)",
    ("defaults", "search-invalid-utf8"):
        "escapes that decode to bytes that are not UTF-8 are a 400 naming the query parameter; Envoy puts "
        "the bytes in the string field, and the upstream refuses the message (grpcio: 500 INTERNAL)",
    ("defaults", "grpc-method-path"):
        "every method answers at POST /pkg.Service/Method; Envoy's auto_mapping maps only the methods "
        "without a google.api.http binding",
}


# Exchanges the served OpenAPI document cannot describe, each with why.
TRAILING = "Envoy's path matcher sets trailing slashes aside, as the filter does; an OpenAPI path matches exactly"
REST = "`**` takes the rest of the path, slashes included; an OpenAPI path parameter holds one segment"
LENIENT = ("proto3 JSON parsers take an enum's number and a 64-bit integer as a JSON number too; the document "
           "gives the form the filter prints")
CLIENT_STREAM = ("a client stream's messages may also be JSON values one after another, or an array with a "
                 "trailing comma, as Envoy reads them; the document gives a JSON array")
EMPTY_STREAM = "an empty stream is an empty body, which openapi-core reads as no response at all"
OPENAPI_DIFFERENCES = {
    ("defaults", "get-shelf-trailing-slash"): TRAILING,
    ("defaults", "list-shelves-trailing-slash"): TRAILING,
    ("defaults", "trailing-slashes"): TRAILING,
    ("defaults", "auto-mapped-method-trailing-slash"): TRAILING,
    ("defaults", "multi-beside-single"): REST,
    ("defaults", "lookup-double-star"): REST,
    ("unescape-options", "lookup-double-star"): REST,
    ("defaults", "any-method-with-a-verb"):
        "a binding of any HTTP method (custom kind \"*\") takes a request with a verb, as Envoy's matcher does; "
        "its path in the document has none",
    ("defaults", "create-shelf-enum-number"): LENIENT,
    ("defaults", "create-shelf-int64-number"): LENIENT,
    ("defaults", "create-shelf-text-plain"):
        "the filter reads a request body as JSON whatever its content type, as Envoy's transcoder; the document "
        "names application/json",
    ("defaults", "search-bool-without-value"):
        "`?exact` alone sets a bool to true; an OpenAPI boolean has no empty value",
    ("defaults", "client-stream-ndjson"): CLIENT_STREAM,
    ("defaults", "client-stream-trailing-comma"): CLIENT_STREAM,
    ("ndjson-streams", "stream-no-books"): EMPTY_STREAM,
    ("sse-streams", "stream-no-books"): EMPTY_STREAM,
}


class Envoys:
    """One Envoy per option set, both filters in it; the cases run grouped
    by option set, so one runs at a time."""

    def __init__(self, descriptors, server):
        self.descriptors, self.server = descriptors, server
        with open(descriptors, "rb") as f:
            self.descriptor_bin = base64.b64encode(f.read()).decode()
        self.current = None

    def get(self, options):
        if self.current is not None and self.current.options != options:
            self.stop()
        if self.current is None:
            self.current = self.start(options)
        return self.current

    def start(self, options):
        # What this filter always does (the README's table): every method at
        # its gRPC path, errors as google.rpc.Status, unknown methods and
        # query parameters refused.
        common = {"services": [SERVICE], "auto_mapping": True, "convert_grpc_status": True,
                  "request_validation_options": {"reject_unknown_method": True,
                                                 "reject_unknown_query_parameters": True},
                  **OPTIONS[options][0]}
        native = {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
            "proto_descriptor": self.descriptors, **common}}
        # The same options, in Envoy's names, and the same descriptor set;
        # Envoy's streaming (one JSON array) is "array" here.
        flags = common.get("print_options", {}).keys() & {"stream_newline_delimited", "stream_sse_style_delimited"}
        ours = {"proto_descriptor_bin": self.descriptor_bin, **({} if flags else {"stream_format": "array"}),
                "openapi": {"path": OPENAPI_PATH}, **common}
        proxy = Envoy(None, [("/", "bookstore", self.server.port)], http_filters=[wasm_filter(ours)],
                      more_filters=[[native]])
        proxy.server, proxy.options = self.server, options
        proxy.openapi = served_document(proxy.port)
        return proxy

    def stop(self):
        if self.current is not None:
            self.current.stop()
            self.current = None


TEXT_ERRORS = []
OPENAPI_PATH = "/openapi.json"


def served_document(port):
    """The filter's OpenAPI document, checked by openapi-spec-validator."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("GET", OPENAPI_PATH)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    assert response.status == 200, raw[:2000]
    assert response.getheader("content-type") == "application/json"
    document = json.loads(raw)
    validate_spec(document)
    return OpenAPI.from_dict(document)


def openapi_errors(openapi, method, path, body, content_type, answer):
    """What openapi-core finds wrong with a request the filter took and its
    answer, against the document the filter serves: a 2xx answer's request
    and response must both match it; an error answer must be the document's
    google.rpc.Status (its request was refused, as the document allows)."""
    url_path, _, query = path.partition("?")
    args = urllib.parse.parse_qs(query, keep_blank_values=True)
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    request = MockRequest("http://localhost", method.lower(), url_path, args=args, data=body or b"",
                          content_type=content_type or "application/json")
    raw = answer["raw"]
    response = MockResponse(raw, status_code=answer["status"],
                            content_type=(answer["content-type"] or "").split(";")[0])
    ok = 200 <= answer["status"] < 300
    errors = [f"request: {e}" for e in openapi.iter_request_errors(request)] if ok else []
    for e in openapi.iter_response_errors(request, response):
        # A refused request may name no operation of the document at all.
        if ok or type(e).__name__ not in ("PathNotFound", "OperationNotFound"):
            errors.append(f"response: {e}")
    return errors


@pytest.fixture(scope="module")
def envoys():
    directory = scratch_dir("grpc-wasm-differential-")
    path = descriptor_set(directory)
    server = ShelvesServer(path)
    pool = Envoys(path, server)
    yield pool
    pool.stop()
    server.stop()
    print(f"\n{len(RUN)} cases in {len(OPTIONS)} option sets; {len(DIFFERENCES)} listed differences; "
          f"{len(TEXT_ERRORS)} where Envoy's own error is text/plain and the filter's a google.rpc.Status")


def exchange(port, case, method, path, body, content_type, via):
    """(status, Content-Type, body as a JSON value or raw bytes)."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    headers = {"x-case": case, "x-via": via}
    if content_type:
        headers["content-type"] = content_type
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request(method, path, body, headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    kind = response.getheader("content-type")
    value = raw
    if kind and kind.startswith("application/json"):
        with contextlib.suppress(ValueError):
            value = strict_json(raw)
    return response.status, kind, value, raw


def strict_json(raw):
    """A JSON value in which integers keep their text (1 is not true, nor
    1.0) and a key given twice is an error, not the last one. Fractions
    compare as numbers: the filter prints the shortest text that reads
    back (ryu: 1e21), Envoy's C++ printer %g's (1e+21), the same number."""
    def pairs(items):
        keys = [k for k, _ in items]
        if len(keys) != len(set(keys)):
            raise ValueError(f"a key given twice: {keys}")
        return dict(items)
    return json.loads(raw, parse_int=lambda t: ("int", t), parse_float=float,
                      parse_constant=lambda t: ("constant", t), object_pairs_hook=pairs)


def answers(envoy, case, method, path, body, content_type):
    """Each filter's answer and what the upstream received for it."""
    out = {}
    for via, port in (("wasm", envoy.port), ("native", envoy.more_ports[0])):
        status, kind, value, raw = exchange(port, case, method, path, body, content_type, via)
        out[via] = {"status": status, "content-type": kind, "body": value,
                    "upstream": envoy.server.received.get((case, via), [])}
        RAW[via] = raw
    return out


def own_error_as_text(native, wasm):
    """Envoy's own error is text/plain; the filter's is google.rpc.Status JSON, same status."""
    return (native["status"] >= 400 and (native["content-type"] or "").startswith("text/plain")
            and native["status"] == wasm["status"] and wasm["content-type"] == "application/json"
            and isinstance(wasm["body"], dict) and {"code", "message"} <= set(wasm["body"])
            and wasm["body"]["code"] != ("int", "0") and native["upstream"] == wasm["upstream"])


def without_empty_details(value):
    """The filter's errors always print `details` (as grpc-gateway's do);
    Envoy's omit it when empty, as proto3 JSON omits an empty list."""
    if isinstance(value, dict) and value.get("details") == [] and {"code", "message"} <= set(value):
        return {k: v for k, v in value.items() if k != "details"}
    return value


def differing(native, wasm):
    wasm = {**wasm, "body": without_empty_details(wasm["body"])}
    return sorted(k for k in native if native[k] != wasm[k])


pytestmark = pytest.mark.filterwarnings("ignore:Use of allowEmptyValue:DeprecationWarning")

RUN = [(options, case) for options, (_, ids) in OPTIONS.items() for case in ids]
RAW = {}
BY_ID = {c[0]: c for c in CASES}


@pytest.mark.parametrize(("options", "case"), RUN, ids=[f"{o}/{c}" for o, c in RUN])
def test_the_same_answer_as_envoys_transcoder(envoys, options, case):
    envoy = envoys.get(options)
    _, method, path, body, content_type = BY_ID[case]
    got = answers(envoy, f"{options}/{case}", method, path, body, content_type)
    native, wasm = got["native"], got["wasm"]
    if own_error_as_text(native, wasm):
        TEXT_ERRORS.append(f"{options}/{case}")
        parts = []
    else:
        parts = differing(native, wasm)
    # Each side reached the upstream with its case's headers, or neither
    # did: an answer that never reached it cannot hide behind [] == [].
    assert (None, None) not in envoy.server.received
    for side in (native, wasm):
        if side["status"] == 200:
            assert side["upstream"], f"{case}: a 200 that reached no upstream (x-case not forwarded?)"
    report = json.dumps(got, indent=1, default=repr)[:4000]
    # The filter's own document describes what it did.
    described = openapi_errors(envoy.openapi, method, path, body, content_type, {**wasm, "raw": RAW["wasm"]})
    undocumented = OPENAPI_DIFFERENCES.get((options, case))
    if undocumented:
        assert described, f"{case} is listed as undocumented ({undocumented}) but its exchange matches the document"
    else:
        assert not described, f"{case}: the served OpenAPI document does not describe it: {described}\n{report}"
    listed = DIFFERENCES.get((options, case))
    if listed:
        assert parts, f"{case} is listed as a difference ({listed}) but both answer the same: {report}"
    else:
        assert not parts, f"{case}: {', '.join(parts)} differ:\n{report}"

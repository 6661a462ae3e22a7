"""What ngx_wasm_module lacks or does its own way, and how the filter answers
there: no gRPC calls, a configuration fetched because a directive holds at
most 4 KB, bodies that nginx keeps outside the buffers a filter can read,
and bodiless requests (the host never says a body is absent)."""

import hashlib
import json
import time
import urllib.request

import pytest

from harness.envoy import free_port, read_protos
from harness.ngx_wasm import NgxWasm


@pytest.fixture
def started():
    proxies = []

    def start(*args, **kwargs):
        proxy = NgxWasm(*args, **kwargs)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


def assert_healthy(proxy, workers):
    """The same workers serve, and nothing crashed or alerted."""
    assert proxy.worker_pids() == workers, proxy.log()
    log = proxy.log()
    for bad in ("[alert]", "[crit]", "[emerg]", "exited on signal", "error while executing"):
        assert bad not in log, log


def test_callout_mode_is_refused_per_request_without_a_hang(started, servers):
    config = {"protos": read_protos("helloworld.proto"), "callout": {"upstream": "greeter"}}
    proxy = started(config, [("/", "greeter", servers["greeter"].port)])
    workers = proxy.worker_pids()
    for _ in range(2):
        began = time.time()
        status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
        assert (status, body["code"]) == (501, 12), (body, proxy.log())
        assert body["message"].startswith("callout: this host (ngx_wasm_module) has no gRPC calls"), body
        # Refused at once; a hang would last to the client's 20 s timeout.
        assert time.time() - began < 10
    assert_healthy(proxy, workers)


def test_an_unreachable_configuration_is_a_503_until_it_loads(started, servers):
    inline = {"fetch": {"upstream": f"127.0.0.1:{free_port()}", "path": "/grpc-wasm.json", "timeout_ms": 500}}
    proxy = started({}, [("/", "greeter", servers["greeter"].port)], inline=inline, wait=False)
    deadline = time.time() + 20
    while "no configuration yet" not in proxy.log():
        assert time.time() < deadline, proxy.log()
        time.sleep(0.2)
    status, body, headers = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, headers["grpc-status"]) == (503, "14"), (body, proxy.log())
    # Why is in the log, not in the answer: the source is no client's business.
    assert body == {"code": 14, "details": [], "message": "grpc-wasm: the filter's configuration is not loaded "
                    "yet (the proxy's error log says why)"}, body
    assert "grpc-wasm: no configuration yet: http://localhost/grpc-wasm.json (upstream 127.0.0.1:" in proxy.log()


def test_a_fetched_configuration_this_host_refuses_keeps_requests_out(started, servers):
    """A configuration server cannot switch the filter off: a document the
    host refuses is retried, and requests keep getting 503, never passing
    through untranscoded."""
    config = {"protos": read_protos("helloworld.proto"), "callout": {"upstream": "x", "upstream_header": "x-up"}}
    proxy = started(config, [("/", "greeter", servers["greeter"].port)], wait=False)
    deadline = time.time() + 20
    while "callout.upstream_header: only for the OpenResty shim" not in proxy.log():
        assert time.time() < deadline, proxy.log()
        time.sleep(0.2)
    status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, body["code"]) == (503, 14), (body, proxy.log())


def test_a_configuration_larger_than_a_directive_is_fetched(started, servers):
    config = {"protos": read_protos("library.proto", "testing.proto", "helloworld.proto")}
    assert len(json.dumps(config)) > 4096
    proxy = started(config, [("/", "library", servers["library"].port)])
    status, body, _ = proxy.post("/v1/shelves", {"id": "9", "theme": "fetched"})
    assert (status, body) == (200, {"id": "9", "theme": "fetched"}), proxy.log()
    assert "grpc-wasm: configured from http://localhost/grpc-wasm.json" in proxy.log()


def test_a_fetched_configuration_is_checked_against_its_sha256(started, servers):
    """Whoever can change the fetched document can change every limit: with
    "sha256" inline, a document that does not match is refused (requests
    get 503, never an unchecked configuration), and the matching one loads."""
    config = {"protos": read_protos("helloworld.proto")}
    document = json.dumps(config).encode()
    digest = hashlib.sha256(document).hexdigest()
    wrong = hashlib.sha256(b"another document").hexdigest()
    proxy = started(config, [("/", "greeter", servers["greeter"].port)], sha256=wrong, wait=False)
    deadline = time.time() + 20
    while "the document's sha256 is" not in proxy.log():
        assert time.time() < deadline, proxy.log()
        time.sleep(0.2)
    assert f"the document's sha256 is {digest}, not the {wrong} the configuration names" in proxy.log()
    status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, body["code"]) == (503, 14), (body, proxy.log())
    proxy = started(config, [("/", "greeter", servers["greeter"].port)], sha256=digest.upper())
    status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, body) == (200, {"message": "Hello x!"}), proxy.log()


def test_a_body_nginx_wrote_to_a_file_is_a_clear_413(started, servers):
    config = {"protos": read_protos("testing.proto")}
    proxy = started(config, [("/", "testing", servers["testing"].port)], body_buffer="64k")
    workers = proxy.worker_pids()
    payload = "QUJD" * 40000  # 160,000 base64 characters
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/EchoBytes", {"payload": payload})
    assert (status, body["code"]) == (413, 8), (body, proxy.log())
    assert body["message"] == ("the request body exceeds the proxy's buffer limit (in nginx, client_body_buffer_size: "
                               "ngx_wasm_module cannot hand a filter a body that nginx wrote to a file); raise it to "
                               "at least max_request_bytes (4194304)"), body
    # One that fits still works.
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/EchoBytes", {"payload": "QUJD"})
    assert (status, body) == (200, {"payload": "QUJD"}), proxy.log()
    assert_healthy(proxy, workers)


def test_a_response_larger_than_the_body_buffers_says_so(started, servers):
    config = {"protos": read_protos("testing.proto")}
    proxy = started(config, [("/", "testing", servers["testing"].port)], response_buffers="4 4k")
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/Large", {"size": 100000})
    # The 200 has left with the headers; the body says why there is no message.
    assert status == 200, proxy.log()
    assert body["code"] == 8, body
    assert body["message"].startswith("the response body exceeds the proxy's buffer limit "
                                      "(in ngx_wasm_module, wasm_response_body_buffers"), body
    status, body, _ = proxy.post("/grpcwasm.testing.Testing/Large", {"size": 100})
    assert status == 200, (str(body)[:200], proxy.log())
    assert len(body["payload"]) > 100, (str(body)[:200], proxy.log())


def test_bodiless_requests_are_seen_as_such(started, servers):
    """ngx_wasm_module announces a body after every request's headers; the
    filter tells from Content-Length and the method."""
    config = {"protos": read_protos("helloworld.proto")}
    proxy = started(config, [("/", "greeter", servers["greeter"].port)])
    status, body, _ = proxy.post("/helloworld.Greeter/SayHello", b"", {"content-length": "0"})
    assert (status, body["code"]) == (400, 3), (body, proxy.log())
    assert body["message"] == "a JSON request body is required (use {} for an empty message)"


def test_reflection_is_refused_at_load_with_one_line(started, servers):
    """No gRPC calls here: "reflection" cannot work, and says so when the
    configuration loads (nginx then stops the worker, as for any
    configuration a filter refuses), never trapping in a call the host
    lacks."""
    inline = {"reflection": {"upstream": f"127.0.0.1:{servers['greeter'].port}"}}
    proxy = started({}, [("/", "greeter", servers["greeter"].port)], inline=inline, wait=False)
    line = ('grpc-wasm: bad configuration: reflection: this host has no gRPC calls (ngx_wasm_module); '
            'give "protos" or "descriptor_set"')
    deadline = time.time() + 20
    while 'failed initializing "grpc_wasm" filter (on_configure failure)' not in proxy.log():
        assert time.time() < deadline, proxy.log()
        time.sleep(0.2)
    log = proxy.log()
    assert log.count(line) == 1, log
    assert "proxy_grpc_stream" not in log, log


def test_the_openapi_document_is_served_here_too(started, servers):
    """"openapi" needs nothing this host lacks: the same document as in
    Envoy, valid OpenAPI, and calls go on beside it."""
    from openapi_spec_validator import validate as validate_spec

    config = {"protos": read_protos("helloworld.proto"), "openapi": {"path": "/openapi.json"}}
    proxy = started(config, [("/", "greeter", servers["greeter"].port)])
    workers = proxy.worker_pids()
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/openapi.json", timeout=20) as r:
        assert (r.status, r.headers.get("content-type")) == (200, "application/json")
        document = json.loads(r.read())
    validate_spec(document)
    assert list(document["paths"]) == ["/helloworld.Greeter/SayHello"]
    status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "x"})
    assert (status, body) == (200, {"message": "Hello x!"}), proxy.log()
    assert_healthy(proxy, workers)

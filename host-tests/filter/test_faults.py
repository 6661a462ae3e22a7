"""Upstreams that break HTTP/2 itself, behind the filter in each host (issue
13): the client gets a gRPC status as JSON at once, never a hang, a bare
proxy error page or a dead worker. One case cannot be answered: an upstream
that breaks after its response headers (see the README's limits)."""

import http.client
import time

import pytest

from harness.envoy import Envoy, read_protos
from harness.raw_h2 import RawH2
from test_scenarios import request

# Each is answered before any response headers leave the proxy.
ANSWERED = ["http1", "goaway", "reset:REFUSED_STREAM", "reset:CANCEL", "reset:ENHANCE_YOUR_CALM",
            "reset:INTERNAL_ERROR"]
MODES = [*ANSWERED, "partial"]


@pytest.fixture(scope="module")
def broken(proxy_factory):
    """A proxy in front of each kind of broken upstream, by mode."""
    started = {}
    for mode in MODES:
        server = RawH2(mode)
        port = int(server.addr.rsplit(":", 1)[1])
        proxy = proxy_factory({"protos": read_protos("helloworld.proto")}, [("/", "broken", port)])
        started[mode] = (proxy, server)
    yield {mode: proxy for mode, (proxy, _) in started.items()}
    for _, server in started.values():
        server.stop()


@pytest.mark.parametrize("mode", ANSWERED)
def test_a_broken_upstream_is_a_json_status(broken, mode):
    proxy = broken[mode]
    status, body, _ = request(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": "x"})
    assert isinstance(body, dict), (status, body, proxy.log()[-2000:])
    # Both hosts report every such failure as a 502/503 of their own; Envoy
    # says why (response.code_details), which the message keeps.
    assert (status, body["code"], body["details"]) == (503, 14, []), body
    message, _, cause = body["message"].partition(": ")
    assert message in ("HTTP status 502 from a non-gRPC response",
                       "HTTP status 503 from a non-gRPC response"), body
    if isinstance(proxy, Envoy):
        assert cause.startswith("upstream_reset_before_response_started{"), body
    else:
        assert cause == "", body


def test_an_upstream_broken_after_its_headers_ends_the_response_at_once(broken):
    """The upstream dies mid-message after its headers. On ngx_wasm_module
    the 200 has left with them and the host does not call the filter again:
    the client sees its response cut short, at once (nginx ends the
    connection with a FIN or, now and then, a TCP reset). Envoy holds one
    answer's headers for the filter, so nothing has left: Envoy answers
    503 itself, straight to the client (past the filters, hence its own
    text). Either way at once, and the proxy serves the next one."""
    proxy = broken["partial"]
    for _ in range(2):
        started = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request("POST", "/helloworld.Greeter/SayHello", b'{"name":"x"}', {"content-type": "application/json"})
        if isinstance(proxy, Envoy):
            response = conn.getresponse()
            assert (response.status, response.read()) == (
                503, b"upstream connect error or disconnect/reset before headers. reset reason: connection "
                     b"termination")
        else:
            with pytest.raises((http.client.IncompleteRead, http.client.RemoteDisconnected,
                                ConnectionResetError, ValueError)):
                conn.getresponse().read()
        conn.close()
        assert time.time() - started < 5
    assert request(broken["http1"], "POST", "/helloworld.Greeter/SayHello", {"name": "x"})[1]["code"] == 14

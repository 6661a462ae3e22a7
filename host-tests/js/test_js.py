"""The npm package (js/npm) in Node and in Chromium, against real servers:
through Envoy's own gRPC-Web and Connect filters, over node:http2 to the
tonic servers directly (plaintext and TLS), and against a server that
answers with broken bodies. The JavaScript tests are node:test files here;
this module starts what they call and runs them."""

import functools
import http.server
import json
import os
import subprocess
import threading
from typing import ClassVar

import pytest

from harness.envoy import Envoy, Server
from harness.paths import ROOT
from harness.shelves_server import ShelvesServer
from harness.shelves_server import descriptor_set as shelves_descriptor_set
from harness.silent_reflection import SilentReflection
from harness.web_envoy import ConnectServer, cors_policy, protoc_descriptor_set, web_envoy, web_filters

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(ROOT, "js", "npm")
CERTS = os.path.join(ROOT, "host-tests", "certs")


@pytest.fixture(scope="module")
def servers():
    subprocess.run([os.path.join(ROOT, "target", "release", "gen-certs"), "--out", CERTS], check=True,
                   capture_output=True)
    started = {"testing": Server("testing-server"), "routeguide": Server("routeguide-server"),
               "greeter": Server("greeter-server"),
               "echo_tls": Server("echo-server", "--tls-dir", CERTS)}
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def envoy(servers):
    proxy = web_envoy(servers)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory):
    """The test services with their imports, as protoc (not our compiler) writes them."""
    out = str(tmp_path_factory.mktemp("protoc") / "tests.binpb")
    return protoc_descriptor_set(out, "testing.proto", "helloworld.proto", "google/rpc/error_details.proto")


@pytest.fixture(scope="module")
def connect_server(descriptor_set):
    server = ConnectServer(descriptor_set)
    yield server
    server.stop()


def node_test(name, env, timeout=120):
    """Runs one node:test file; its report is the assertion's message."""
    proc = subprocess.run(["node", "--test", "--test-reporter=spec", os.path.join(HERE, name)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, cwd=HERE)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_grpc_web_and_connect_through_envoy_and_connect_node(envoy, connect_server):
    node_test("web.test.mjs", {"ENVOY_URL": f"http://127.0.0.1:{envoy.port}", "CONNECT_URL": connect_server.url})


def test_native_grpc_over_node_http2(servers):
    node_test("http2.test.mjs", {
        "TESTING_URL": f"http://{servers['testing'].addr}",
        "ROUTEGUIDE_URL": f"http://{servers['routeguide'].addr}",
        "ECHO_TLS_URL": f"https://localhost:{servers['echo_tls'].port}",
        "CA_PEM": os.path.join(CERTS, "ca.pem"),
    })


def test_schemas_from_reflection_over_grpc_and_grpc_web(tmp_path):
    """loadFromReflection against tonic's v1 and v1alpha and grpcio's
    reflection over node:http2, and over gRPC-Web through Envoy's grpc_web
    filter (routing /grpc.reflection. to the server, as a browser needs)."""
    started = [Server("routeguide-server", "--reflection", "v1"),
               Server("greeter-server", "--reflection", "v1alpha"), Server("greeter-server"),
               ShelvesServer(shelves_descriptor_set(str(tmp_path)), reflection=True), SilentReflection()]
    routeguide, greeter, plain, shelves, silent = started
    try:
        proxy = Envoy(None, [("/grpc.reflection.", "reflection", routeguide.port),
                             ("/routeguide.", "routeguide", routeguide.port)],
                      http_filters=web_filters(), virtual_host=cors_policy("http://127.0.0.1"))
        started.append(proxy)
        node_test("reflection.test.mjs", {
            "ROUTEGUIDE_URL": f"http://{routeguide.addr}", "GREETER_V1ALPHA_URL": f"http://{greeter.addr}",
            "PLAIN_URL": f"http://{plain.addr}", "SHELVES_URL": f"http://127.0.0.1:{shelves.port}",
            "SILENT_URL": f"http://{silent.addr}", "ENVOY_URL": f"http://127.0.0.1:{proxy.port}",
        })
    finally:
        for one in reversed(started):
            one.stop()


def test_schemas_codecs_and_the_package_as_npm_sees_it(descriptor_set):
    node_test("schema.test.mjs", {"DESCRIPTOR_SET": descriptor_set})


def test_broken_answers_end_in_clear_errors():
    node_test("bad_input.test.mjs", {})


class PageHandler(http.server.SimpleHTTPRequestHandler):
    """The example page, the package and the protos, from loopback, under a
    strict Content-Security-Policy: no eval (WebAssembly compilation alone is
    allowed), scripts and styles from this origin only, and fetches to this
    origin and to Envoy."""

    envoy_origin = ""
    extensions_map: ClassVar = {".js": "text/javascript", ".wasm": "application/wasm", ".html": "text/html",
                      ".css": "text/css", ".proto": "text/plain"}
    roots: ClassVar = {"/pkg/": PACKAGE, "/protos/": os.path.join(ROOT, "protos"), "/": os.path.join(HERE, "page")}

    def translate_path(self, path):
        path = path.split("?", 1)[0]
        for prefix, root in self.roots.items():
            if path.startswith(prefix):
                return os.path.join(root, os.path.normpath(path[len(prefix):]).lstrip("/."))
        return ""

    def end_headers(self):
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; "
                         f"connect-src 'self' {self.envoy_origin}")
        super().end_headers()

    def log_message(self, *args):
        pass


def test_the_browser_example_in_chromium(envoy, tmp_path):
    """The README's browser example (page/app.js) in Debian's Chromium: a
    .proto loaded at run time, calls through Envoy cross-origin, under CSP."""
    envoy_origin = f"http://127.0.0.1:{envoy.port}"
    handler = type("Handler", (PageHandler,), {"envoy_origin": envoy_origin})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    screenshot = os.path.join(ROOT, "target", "js-browser", "example.png")
    os.makedirs(os.path.dirname(screenshot), exist_ok=True)
    try:
        page = f"http://127.0.0.1:{server.server_address[1]}/index.html?envoy={envoy_origin}"
        proc = subprocess.run(["node", os.path.join(HERE, "browser.mjs"), page, screenshot], capture_output=True,
                              text=True, timeout=120, cwd=HERE)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["problems"] == []
    assert result["shown"] == {
        "hello": "Hello browser!",
        "features": "35 features, first: 12 Orchard Lane, Chester, NJ 07930, USA",
        "connect": "Hello connect!",
        "error": "PERMISSION_DENIED: not for you [google.rpc.ErrorInfo, google.rpc.BadRequest]",
        "log": "",
    }
    # Not blank: a page of text and colour compresses worse than an empty one.
    assert result["screenshotBytes"] > 2 * result["blankBytes"], result

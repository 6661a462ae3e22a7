"""The npm package (js/npm) in Node and in Chromium, against real servers:
through Envoy's own gRPC-Web and Connect filters, over node:http2 to the
tonic servers directly (plaintext and TLS), and against a server that
answers with broken bodies. The JavaScript tests are node:test files here;
this module starts what they call and runs them."""

import os
import subprocess

import pytest

from harness import ROOT, Server
from web_envoy import ConnectServer, protoc_descriptor_set, web_envoy

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
def connect_server(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("connect") / "tests.binpb")
    protoc_descriptor_set(out, "testing.proto", "helloworld.proto", "google/rpc/error_details.proto")
    server = ConnectServer(out)
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


def test_broken_answers_end_in_clear_errors():
    node_test("bad_input.test.mjs", {})

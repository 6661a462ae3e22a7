"""resty.ffi.grpc in real nginx through LuaJIT's FFI (stock nginx-lua, no
C module), against the tonic test servers."""

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request

import pytest

from harness.nginx import Nginx, Server, check_log, ensure_certs, free_port
from harness.paths import BIN, PROTOS, SHIM


@pytest.fixture(scope="module")
def servers():
    certs = ensure_certs()
    servers = {
        "greeter": Server("greeter-server"),
        "routeguide": Server("routeguide-server"),
        "testing": Server("testing-server"),
        "echo_tls": Server("echo-server", "--tls-dir", certs),
        "echo_mtls": Server("echo-server", "--tls-dir", certs, "--mtls"),
    }
    env = {name: s.addr for name, s in servers.items()}
    # Port 1 (tcpmux): nothing listens there, and no test server can take it.
    env.update(dead="127.0.0.1:1", certs=certs, protos=PROTOS, shim=SHIM)
    yield env
    for s in servers.values():
        s.stop()


@pytest.fixture(scope="module", params=["runtime", "cosocket"])
def nginx(servers, request):
    """Both transports of the FFI path: the shim's tonic runtime, and
    HTTP/2 over a cosocket per connection (GRPC_WASM_TRANSPORT)."""
    proxy = Nginx(servers, transport=request.param)
    yield proxy
    proxy.stop()
    check_log(proxy)


@pytest.fixture(scope="module")
def nginx_resty_ffi(servers, tmp_path_factory):
    """nginx whose Lua sees ngx.load_ffi and asks for it (GRPC_WASM_MODE):
    resty.ffi.grpc takes the lua-resty-ffi path, served by the C harness."""
    out = tmp_path_factory.mktemp("harness")
    subprocess.run(["sh", os.path.join(os.path.dirname(__file__), "..", "resty-ffi", "build.sh"), str(out)], check=True)
    env = dict(servers, resty_ffi_harness=str(out / "libresty_ffi_harness.so"))
    proxy = Nginx(env, http_extra='init_by_lua_block { require("fake_resty_ffi") }', mode="resty_ffi")
    yield proxy
    proxy.stop()
    check_log(proxy)


def test_the_issue_program(nginx):
    status, body = nginx.get("/t/program")
    assert status == 200, body + nginx.log()[-3000:]
    lines = body.splitlines()
    features = [json.loads(line) for line in lines[2:37]]
    assert features[0] == {"name": "12 Orchard Lane, Chester, NJ 07930, USA",
                           "location": {"latitude": 409012345, "longitude": -742567890}}
    assert all(f["location"]["latitude"] >= 400000000 for f in features)
    assert lines[:2] + lines[37:] == [
        "unary: Hello foobar!",
        "mtls: hello",
        "server streaming: 35 features",
        "client streaming: points 3 features 1",
        "client streaming end: nil",
        "bidi 1: ",
        "bidi 2: note 1",
        "bidi 3: note 1,note 2",
        "bidi end: true nil",
    ]


def test_large_requests_over_tls_and_mtls_on_a_fresh_connection(nginx):
    """rustls held at most 64 KiB of data written before its handshake
    ended, and h2 writes its first window (65,535 bytes) at once: on
    cosocket every request over about 64 KiB on a fresh TLS connection
    failed 'UNAVAILABLE (14): the connection failed: write zero' (gRPC's
    interop large_unary over TLS)."""
    status, body = nginx.get("/t/tls_sizes", timeout=120)
    assert status == 200, body + nginx.log()[-3000:]
    cases = [f"{kind} {size}: ok" for kind in ("tls", "mtls")
             for size in (65535, 65536, 65537, 70000, 1048576, 4000000)]
    expected = [*cases[:6], "tls stream of 3 MiB: ok", *cases[6:], "mtls stream of 3 MiB: ok"]
    assert body.splitlines() == expected, body


def test_status_messages_arrive_byte_for_byte(nginx):
    """The module cut every message's trailing whitespace and a trailing
    {...} group, a rule for what Envoy appends, in a host that appends
    nothing (gRPC's interop special_status_message)."""
    status, body = nginx.get("/t/status_messages")
    assert (status, body) == (200, "1: same\n2: same\n3: same\n"), body + nginx.log()[-3000:]


def test_a_unary_answer_over_4_mib_is_resource_exhausted_on_both_transports(nginx):
    """runtime gave tonic's 'OUT_OF_RANGE (11): Error, decoded message length
    too large' where cosocket and the README say RESOURCE_EXHAUSTED."""
    status, body = nginx.get("/t/large_answer")
    assert (status, body) == (200, "false RESOURCE_EXHAUSTED (8): grpc: received message larger than max "
                                   "(5000005 vs. 4194304)\n"), body + nginx.log()[-3000:]


def test_the_issue_program_through_lua_resty_ffi(nginx_resty_ffi):
    status, body = nginx_resty_ffi.get("/t/program")
    assert status == 200, body + nginx_resty_ffi.log()[-3000:]
    assert body.splitlines()[0] == "unary: Hello foobar!"
    assert body.splitlines()[-1] == "bidi end: true nil"
    assert len(body.splitlines()) == 44
    assert nginx_resty_ffi.get("/t/mode") == (200, "resty_ffi\n")


def test_named_headers_propagate_through_lua_resty_ffi(nginx_resty_ffi):
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               "x-request-id": "r-1"}
    req = urllib.request.Request(f"http://127.0.0.1:{nginx_resty_ffi.port}/t/propagate_named_here?own=mine",
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=20) as r:
        metadata = json.loads(r.read())
    assert metadata["traceparent"] == headers["traceparent"], metadata
    # The call's own metadata wins over the header of the same name.
    assert metadata["x-request-id"] == "mine", metadata
    # A value that is no UTF-8 (nginx takes obs-text) stays behind alone:
    # the lua-resty-ffi task is JSON, which could not carry it as text.
    req = urllib.request.Request(f"http://127.0.0.1:{nginx_resty_ffi.port}/t/propagate_named_here",
                                 headers={"traceparent": "caf\u00e9", "x-request-id": "r-2"})
    with urllib.request.urlopen(req, timeout=20) as r:
        metadata = json.loads(r.read())
    assert "traceparent" not in metadata, metadata
    assert metadata["x-request-id"] == "r-2", metadata


def test_stock_nginx_takes_the_ffi_path(nginx):
    assert nginx.get("/t/mode") == (200, "ffi\n")


def test_failures(nginx):
    status, body = nginx.get("/t/failures")
    assert status == 200, body + nginx.log()[-3000:]
    lines = body.splitlines()
    assert lines[0] == "down: false | UNAVAILABLE | 14", body
    assert lines[1] == "down fast: true", body
    assert lines[2] == "deadline: false | DEADLINE_EXCEEDED | 4", body
    assert lines[3] == "deadline in time: true", body
    assert lines[4] == "details: false | NOT_FOUND (5): no such book | 5", body
    assert lines[5] == "details[1]: type.googleapis.com/google.rpc.ErrorInfo TEST_FAILURE", body
    assert lines[6] == "details[2]: type.googleapis.com/google.rpc.BadRequest code", body
    assert lines[7] == ("unknown method: false | UNIMPLEMENTED (12): unknown method "
                        "'/grpcwasm.testing.Testing/Nope' | 12"), body
    assert lines[8] == "wrong type: false | INVALID_ARGUMENT (3): millis: expected integer, got array | 3", body
    assert lines[9] == "not a table: false | the message must be a table or a JSON string, got number | -", body
    assert lines[10] == "metadata: true ann nil header ann trailer ann", body
    assert lines[11] == "wrong ca: false | UNAVAILABLE | 14", body
    assert lines[12] == "wrong name: false | UNAVAILABLE | 14", body
    assert lines[13].startswith("bad pem: false | invalid TLS options: ca is not PEM text"), body
    assert lines[14] == "after close: false | the connection is closed | -", body
    assert lines[15] == "stream after close: false | the connection is closed | -", body
    assert lines[16] == "stream error after 2: FAILED_PRECONDITION (9): stop", body
    # A failed stream repeats its failure (issue 14: results that lie).
    assert lines[17] == "recv after end: false FAILED_PRECONDITION (9): stop", body
    assert lines[18].startswith("missing file: false | cannot read "), body
    assert lines[19] == "bad address: false | the address must be a string like '127.0.0.1:50051' | -", body
    assert lines[20] == "collected: ok", body
    assert lines[21] == "json options: true number nil", body
    assert lines[23] == ("bad path: false UNIMPLEMENTED (12): the module does not handle this path "
                         "(it is not /package.Service/Method)"), body
    assert lines[22] == ("bad json option: false INVALID_ARGUMENT (3): x-grpc-wasm-json-options: "
                         "unknown JSON option 'pretty'"), body
    # gRPC's interop cancel_after_first_response: the caller sees CANCELLED.
    assert lines[24] == "recv after cancel: true false CANCELLED (1): the stream was cancelled by its caller 1", body
    assert lines[25] == "recv after end and close: true nil false the stream is closed", body


def test_server_killed_mid_stream(nginx):
    server = Server("testing-server")
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=nginx.get(f"/t/midstream?addr={server.addr}")))
    started = time.time()
    # Counted before the request: its own line may come before the wait.
    before = nginx.log().count("midstream first message")
    thread.start()
    nginx.wait_for_log("midstream first message", count=before + 1)
    server.proc.kill()
    thread.join(timeout=30)
    status, body = result["r"]
    assert status == 200, body
    assert body.strip() in ("after some: UNAVAILABLE", "after some: INTERNAL", "after some: UNKNOWN"), body
    assert time.time() - started < 10


def test_1000_calls_in_flight_in_one_worker(nginx):
    status, body = nginx.get("/t/inflight?n=1000")
    assert status == 200, body
    done, failed, seconds = re.match(r"done (\d+) failed (\d+) seconds ([\d.]+)", body).groups()
    assert (done, failed) == ("1000", "0"), body
    # Sequential, they would take 300 s.
    assert float(seconds) < 60, body


def test_a_conn_comes_back_with_its_server(nginx):
    port = free_port()

    def start():
        # The same port each time: the conn must find the server again.
        proc = subprocess.Popen([os.path.join(BIN, "greeter-server"), "--addr", f"127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("listening on"), proc.stderr.read()
        return proc
    proc = start()
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=nginx.get(f"/t/reconnect?addr=127.0.0.1:{port}")))
    # Each change the handler sees is logged: kill after the first ok,
    # bring the server back after the first failure (counted before the
    # request, whose first line may come before the wait).
    seen = nginx.log().count("reconnect seen ")
    thread.start()
    nginx.wait_for_log("reconnect seen ", count=seen + 1)
    proc.kill()
    proc.wait()
    nginx.wait_for_log("reconnect seen ", count=seen + 2)
    proc = start()
    thread.join(timeout=60)
    proc.kill()
    assert result["r"] == (200, "ok,UNAVAILABLE,ok\n"), result


@pytest.mark.skipif(not shutil.which("h2load"), reason="h2load (nghttp2-client) is not installed")
def test_500_concurrent_requests(nginx):
    assert nginx.get("/t/unary")[1].strip() == "Hello load!"
    out = subprocess.run(["h2load", "--h1", "-n", "5000", "-c", "500", f"http://127.0.0.1:{nginx.port}/t/unary"],
                         capture_output=True, text=True, timeout=120).stdout
    assert re.search(r"requests: 5000 total, 5000 started, 5000 done, 5000 succeeded, 0 failed, 0 errored", out), out
    assert "status codes: 5000 2xx" in out, out


@pytest.mark.parametrize("transport", ["runtime", "cosocket"])
def test_a_kept_stream_after_its_end_lets_the_worker_exit(servers, transport):
    """The FFI backend held a stream's semaphore until the stream was
    closed, and an exiting worker's wake-up reader runs while any is held:
    a stream read to its end but kept (never closed, never collected) held
    the worker in "shutting down" for good (gRPC's interop
    timeout_on_sleeping_server left one)."""
    proxy = Nginx(servers, transport=transport, workers=1)
    assert proxy.get("/t/ended_stream_kept") == (200, "false 4\n"), proxy.log()[-3000:]
    started = time.time()
    proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log()[-3000:]
    assert time.time() - started < 5


@pytest.mark.parametrize("transport", ["runtime", "cosocket"])
def test_a_plaintext_call_to_a_tls_server_hints_at_tls(nginx, transport):
    status, body = nginx.get(f"/t/plaintext_to_tls?transport={transport}")
    assert status == 200
    ok, name, message = body.strip().split(" | ")
    assert (ok, name) == ("false", "UNAVAILABLE"), body
    assert "does the server want TLS? connect with TLS options: ca, host" in message, body


def test_a_plaintext_call_to_a_grpcio_tls_server_hints_at_tls_on_both_transports():
    """grpcio's TLS server (BoringSSL) closes on the HTTP/2 preface without
    an alert that h2 could read: the cosocket saw only 'closed', and said
    nothing of TLS."""
    from harness.interop import start_interop_server

    proc, ports = start_interop_server(ensure_certs())
    proxy = None
    try:
        proxy = Nginx({"echo_tls": f"127.0.0.1:{ports['tls']}", "protos": PROTOS}, workers=1)
        hint = "(does the server want TLS? connect with TLS options: ca, host)"
        for transport in ("cosocket", "runtime"):
            status, body = proxy.get(f"/t/plaintext_to_tls?transport={transport}")
            # The cause is the socket's word (closed, a broken pipe, a reset).
            assert status == 200, (transport, body)
            assert body.startswith("false | UNAVAILABLE | UNAVAILABLE (14): the connection failed: "), (transport, body)
            assert body.endswith(f" {hint}\n"), (transport, body)
    finally:
        if proxy:
            proxy.stop()
        proc.kill()
        proc.wait()

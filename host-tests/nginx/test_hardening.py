"""Hardening (issue 14) of resty.ffi.grpc and liblua_shim.so in real nginx:
what a hostile file, peer or caller can do to a worker."""

import os
import re
import shutil

import pytest

from harness.nginx import Nginx, Server, check_log
from harness.paths import PROTOS, WASM

# An empty wasm module: a valid module without the exports the shim needs.
EMPTY_WASM = b"\0asm\x01\0\0\0"


@pytest.fixture(scope="module")
def greeter():
    server = Server("greeter-server")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cache_entries(greeter, tmp_path_factory):
    """A private cache directory filled by a worker: the entry of the real
    module, and the compiled code of another (valid) module."""
    root = tmp_path_factory.mktemp("cache")
    cache = root / "cache"
    tiny = root / "tiny.wasm"
    tiny.write_bytes(EMPTY_WASM)
    env = {"greeter": greeter.addr, "protos": PROTOS, "wasm": WASM, "cache_dir": str(cache)}
    proxy = Nginx(env, workers=1)
    try:
        _status, body = proxy.get(f"/t/hardening_cache?module={tiny}")
        assert body.startswith("init: the wasm module lacks the export"), body
        tiny_entries = set(os.listdir(cache))
        assert len(tiny_entries) == 1, tiny_entries
        assert proxy.get("/t/hardening_cache") == (200, "Hello cache!\n"), proxy.log()[-3000:]
    finally:
        proxy.stop()
    check_log(proxy)
    (real,) = set(os.listdir(cache)) - tiny_entries
    (other,) = tiny_entries
    planted = root / "planted.cwasm"
    shutil.copy(cache / other, planted)
    return env, cache, cache / real, planted


def plant(how, cache, entry, planted):
    """Puts the other module's code where the real module's entry is, made
    unsafe in one way."""
    os.chmod(cache, 0o700)
    if os.path.lexists(entry):
        os.remove(entry)
    if how == "symlink":
        os.symlink(planted, entry)
        return f"{entry} is a symbolic link"
    shutil.copy(planted, entry)
    os.chmod(entry, 0o600)
    if how == "owner":
        os.chown(entry, 65534, 65534)
        return f"{entry} is owned by uid 65534, not by this process's uid 0"
    os.chmod(cache, 0o770)
    return f"{cache} is writable by group or others (mode 770)"


@pytest.mark.parametrize("how", ["owner", "group-writable-dir", "symlink"])
def test_a_planted_cache_entry_is_refused_and_the_worker_serves(cache_entries, how):
    env, cache, entry, planted = cache_entries
    reason = plant(how, cache, entry, planted)
    proxy = Nginx(env, workers=1)
    try:
        status, body = proxy.get("/t/hardening_cache")
        log = proxy.log()
    finally:
        proxy.stop()
        os.chmod(cache, 0o700)
    assert (status, body) == (200, "Hello cache!\n"), log[-3000:]
    assert f"[grpc-wasm] compiled-module cache not used: {reason}; compiling the module instead" in log, log[-3000:]
    check_log(proxy)


@pytest.fixture(scope="module")
def servers():
    started = {"greeter": Server("greeter-server"), "testing": Server("testing-server")}
    env = {name: s.addr for name, s in started.items()}
    env.update(protos=PROTOS)
    yield env
    for s in started.values():
        s.stop()


@pytest.fixture(scope="module")
def nginx(servers):
    proxy = Nginx(servers, workers=1)
    yield proxy
    proxy.stop()
    check_log(proxy)


def test_metadata_cannot_smuggle_entries(nginx):
    status, body = nginx.get("/t/hardening_metadata")
    assert status == 200, body + nginx.log()[-3000:]
    control = (
        "is not printable ASCII (0x20-0x7E: no NUL, CR, LF or other control character);"
        " binary values need a key ending in -bin"
    )
    assert body.splitlines() == [
        f"nul in value: false metadata value of 'a' {control}",
        f"crlf in value: false metadata value of 'a' {control}",
        "nul in key: false invalid metadata key 'a?authorization': only letters, digits, '-', '_' and '.'",
        f"utf-8 in value: false metadata value of 'a' {control}",
        f"del in value: false metadata value of 'a' {control}",
        "not a table: false metadata must be a table, got string",
        "bin: true authorization=nil a=nil bin=intact trailer=intact",
        "plain: true authorization=nil a=fine bin=nil trailer=nil",
    ], body


@pytest.fixture(scope="module")
def nginx_results(tmp_path_factory):
    started = {"routeguide": Server("routeguide-server"), "testing": Server("testing-server")}
    tmp = tmp_path_factory.mktemp("protos")
    for kind, body in (("bad", "message Hardening { Missing m = 1; }"), ("good", "message Hardening { int32 m = 1; }"),
                       ("syntax", "message Hardening {\n  int32 m = 1\n  int64 n = 2;\n}")):
        (tmp / kind).mkdir()
        (tmp / kind / "hardening.proto").write_text(f'syntax = "proto3";\npackage hardening;\n{body}\n')
    env = {name: s.addr for name, s in started.items()}
    env.update(protos=PROTOS, tmp=str(tmp))
    proxy = Nginx(env, workers=1)
    yield proxy
    proxy.stop()
    for s in started.values():
        s.stop()
    check_log(proxy)


def test_results_never_lie(nginx_results):
    status, body = nginx_results.get("/t/hardening_results")
    assert status == 200, body + nginx_results.log()[-3000:]
    lines = body.splitlines()
    undecodable = ("false | INTERNAL (13): cannot decode a response message as JSON: "
                   "Found too many nested data structures (2) at character 62 | 13 INTERNAL")
    assert lines[0] == f"undecodable message: {undecodable}", body
    assert lines[1] == f"recv again: {undecodable}", body
    assert lines[2] == f"undecodable unary: {undecodable}", body
    assert lines[3] == "first: true {}", body
    assert lines[4] == "failure: false | FAILED_PRECONDITION (9): stop | 9 FAILED_PRECONDITION", body
    assert lines[5] == "failure again: false | FAILED_PRECONDITION (9): stop | 9 FAILED_PRECONDITION", body
    assert lines[6] == "bad proto: false | protos: hardening.proto:3:21: name 'Missing' is not defined | - -", body
    assert lines[7] == ("syntax error: false | hardening.proto:5:3: expected ';' or '[', but found 'int64' | - -"), body
    assert lines[8] == "fixed proto: true | nil | - -", body
    # The server reports how long a 0 ms sleep took: a few ms on a busy machine.
    assert re.fullmatch(r'later call: true \{"sleptMillis":"\d+"\}', lines[9]), body


def test_misuse_returns_errors_and_tls_options_never_fall_back_to_plaintext(nginx):
    status, body = nginx.get("/t/hardening_misuse")
    assert status == 200, body + nginx.log()[-3000:]
    assert body.splitlines() == [
        f"readfile missing: false | {PROTOS}/missing.pem: No such file or directory",
        "readfile: true | true",
        "ca from a failed readfile: false | invalid TLS options: ca must be a non-empty string, "
        "got boolean (grpc.readfile returns ok, content: pass the content)",
        "ca as readfile's first value: false | invalid TLS options: ca must be a non-empty string, "
        "got boolean (grpc.readfile returns ok, content: pass the content)",
        "ca a number: false | invalid TLS options: ca must be a non-empty string, got number",
        "host empty: false | invalid TLS options: host must be a non-empty string, got an empty string",
        "opts a string: false | connect options must be a table, got string",
        "init opts a string: false | init options must be a table, got string",
        "json options a string: false | JSON options must be a table, got string",
        "include a string: false | include must be a list of directories, got string",
        "call opts a number: false | call options must be a table, got number",
        "timeout a string: false | timeout must be a positive number of milliseconds, got string",
        "timeout negative: false | timeout must be a positive number of milliseconds, got number -1",
        "stream opts a string: false | call options must be a table, got string",
        "then: true Hello still!",
    ], body


@pytest.fixture(scope="module")
def sleeper():
    """A grpcio server whose Sleep outlives any deadline and never answers
    DEADLINE_EXCEEDED itself (the tonic testing-server does)."""
    import concurrent.futures
    import threading

    import grpc

    # Far past any bound the test sets; released at teardown, so that the
    # server's threads do not hold the interpreter's exit.
    released = threading.Event()

    def sleep(request, context):
        released.wait(30)
        return b""

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        "grpcwasm.testing.Testing", {"Sleep": grpc.unary_unary_rpc_method_handler(sleep)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    released.set()
    server.stop(0)


def test_an_expired_deadline_is_deadline_exceeded_on_both_transports(servers, sleeper):
    proxy = Nginx(dict(servers, sleeper=sleeper), workers=1)
    try:
        status, body = proxy.get("/t/hardening_deadline")
    finally:
        proxy.stop()
    assert status == 200, body + proxy.log()[-3000:]
    # The module's own deadline, the transport's and the server's race;
    # the first two say the same (transport::tests pins the transport's).
    texts = ("deadline of 300 ms exceeded", "Deadline Exceeded")
    assert len(body.splitlines()) == 2, body
    assert body.splitlines() == [
        f"{transport}: false | DEADLINE_EXCEEDED (4): {text} | 4 | in time: true"
        for transport, line in zip(("runtime", "cosocket"), body.splitlines(), strict=True)
        for text in texts if line.endswith(f"(4): {text} | 4 | in time: true")
    ], body
    check_log(proxy)

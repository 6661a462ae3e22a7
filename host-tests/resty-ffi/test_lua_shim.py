"""liblua_shim.so through lua-resty-ffi's exact C ABI (the harness stands in
for OpenResty): tasks in, answers out, a panic inside a task, and the
shutdown by a NULL poll."""

import json
import os

import pytest

from harness.envoy import Server
from harness.paths import PROTOS, ROOT
from harness.resty_ffi import HarnessError

SHIM = os.environ.get("GRPC_WASM_SHIM", os.path.join(ROOT, "target", "release", "liblua_shim.so"))
WASM = os.environ.get("GRPC_WASM_MODULE", os.path.join(ROOT, "target", "grpc_wasm.wasm"))


@pytest.fixture(scope="module")
def h(harness_build):
    # The shim's test-only "panic" op.
    os.environ["GRPC_WASM_TEST_HOOKS"] = "1"
    return harness_build[1]


@pytest.fixture(scope="module")
def servers():
    started = {"greeter": Server("greeter-server"), "routeguide": Server("routeguide-server")}
    yield started
    for s in started.values():
        s.stop()


def task(h, rt, **request):
    return h.call(rt, json.dumps(request).encode(), timeout=15)


def end_of(answer):
    """An `E <status> <code> <headers length>` event: (http status, headers,
    body), its gRPC code checked against the reply's grpc-status."""
    head, rest = answer.split(b"\n", 1)
    _, status, code, length = head.split(b" ")
    raw, body = rest[:int(length)], rest[int(length):]
    parts = raw.split(b"\0")[:-1]
    headers = dict(zip(parts[::2], parts[1::2], strict=False))
    assert int(code) == int(headers.get(b"grpc-status", b"2")), answer
    return int(status), headers, body


def test_init_copies_cfg_and_reports_failure(h):
    with pytest.raises(HarnessError):
        h.load(SHIM, json.dumps({"module": "/nonexistent.wasm"}))


def test_unary_streaming_panic_and_shutdown(h, servers):
    h.reset_counters()
    rt = h.load(SHIM, json.dumps({"module": WASM}))
    assert task(h, rt, op="loadfile", path=os.path.join(PROTOS, "helloworld.proto")) == (0, None)
    assert task(h, rt, op="loadfile", path=os.path.join(PROTOS, "route_guide.proto")) == (0, None)
    rc, conn = task(h, rt, op="connect", addr=servers["greeter"].addr)
    assert rc == 0
    # unary: start, then the end event
    rc, call = task(h, rt, op="start", conn=int(conn), path="/helloworld.Greeter/SayHello", body='{"name":"ffi"}')
    assert rc == 0
    rc, answer = task(h, rt, op="next", id=int(call))
    status, headers, body = end_of(answer)
    assert (rc, status, headers[b"grpc-status"], body) == (0, 200, b"0", b'{"message":"Hello ffi!"}')
    # an error answers rc 1 with the text
    assert task(h, rt, op="start", conn=999, path="/x/y", body="{}") == (1, b"unknown or closed connection")
    # a panic inside a task: answered (rc 2), and the runtime goes on;
    # what it may have left half-written is not used again: the
    # connections it had are closed, and new ones serve
    rc, text = task(h, rt, op="panic")
    assert rc == 2
    assert b"panic" in text
    closed = task(h, rt, op="start", conn=int(conn), path="/helloworld.Greeter/SayHello", body="{}")
    assert closed == (1, b"unknown or closed connection")
    # server streaming: messages one by one, then the end
    rc, rg = task(h, rt, op="connect", addr=servers["routeguide"].addr)
    rc, call = task(h, rt, op="start", conn=int(rg), path="/routeguide.RouteGuide/ListFeatures")
    rect = {"lo": {"latitude": 400000000, "longitude": -750000000},
            "hi": {"latitude": 420000000, "longitude": -730000000}}
    assert task(h, rt, op="send", id=int(call), body=json.dumps(rect)) == (0, None)
    assert task(h, rt, op="close_send", id=int(call)) == (0, None)
    messages = 0
    while True:
        rc, answer = task(h, rt, op="next", id=int(call))
        assert rc == 0
        if answer.startswith(b"M\n"):
            messages += 1
            assert b'"location"' in answer
            continue
        assert end_of(answer)[1][b"grpc-status"] == b"0"
        break
    assert messages == 35
    # a task still waiting when the queue goes away is answered anyway
    rc, call = task(h, rt, op="start", conn=int(rg), path="/routeguide.RouteGuide/RouteChat")
    waiting = h.submit(rt, json.dumps({"op": "next", "id": int(call)}).encode())
    assert h.shutdown(rt)
    assert h.wait(waiting, timeout=5) == (1, b"the grpc-wasm runtime was unloaded")
    assert h.violations() == 0, h.last_violation()
    assert h.poll_after_null() == 0


def test_every_next_ends_by_its_timeout(h, servers):
    import time
    rt = h.load(SHIM, json.dumps({"module": WASM}))
    assert task(h, rt, op="loadfile", path=os.path.join(PROTOS, "helloworld.proto")) == (0, None)
    rc, conn = task(h, rt, op="connect", addr=servers["greeter"].addr)
    # A call whose request never ends: nothing will ever happen to it.
    rc, call = task(h, rt, op="start", conn=int(conn), path="/helloworld.Greeter/SayHello", timeout=60000)
    assert rc == 0
    started = time.time()
    assert task(h, rt, op="next", id=int(call), timeout=300) == (1, b"timeout waiting for the call's next event")
    # The call itself lasts 60 s.
    assert 0.25 < time.time() - started < 5
    # A call nobody started is answered at once: nothing would wake it.
    assert task(h, rt, op="next", id=424242) == (1, b"unknown or finished call")
    assert task(h, rt, op="close", id=int(call)) == (0, None)
    assert h.shutdown(rt)
    assert h.violations() == 0, h.last_violation()


def grpc_wasm_threads():
    """The shim's threads in this process (grpc-wasm-ffi, -expiry, and the
    tokio runtime's grpc-wasm)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith("grpc-wasm"))


def test_a_null_poll_ends_the_runtime(h, servers):
    """What lua-resty-ffi's runtime:__unload() does: the end marker goes
    behind the queued tasks, which are answered in order, a waiting `next`
    is answered too, and then the runtime is gone: its threads end, its
    connections and descriptors close, and the queue is never polled again."""
    import time
    h.reset_counters()

    def gone(threads):
        deadline = time.time() + 5
        while grpc_wasm_threads() != threads and time.time() < deadline:
            time.sleep(0.05)
        return grpc_wasm_threads()
    # tokio's first runtime in a process opens a socket pair for signals
    # that stays for the process: the count starts after one.
    threads = grpc_wasm_threads()
    assert h.shutdown(h.load(SHIM, json.dumps({"module": WASM})))
    assert gone(threads) == threads
    fds = len(os.listdir("/proc/self/fd"))
    rt = h.load(SHIM, json.dumps({"module": WASM}))
    # Names as the kernel keeps them (15 bytes); threads name themselves
    # once they run.
    deadline = time.time() + 5
    while not {"grpc-wasm-ffi", "grpc-wasm-expir"} <= set(grpc_wasm_threads()) and time.time() < deadline:
        time.sleep(0.05)
    assert {"grpc-wasm-ffi", "grpc-wasm-expir"} <= set(grpc_wasm_threads()), grpc_wasm_threads()
    assert task(h, rt, op="loadfile", path=os.path.join(PROTOS, "route_guide.proto")) == (0, None)
    rc, conn = task(h, rt, op="connect", addr=servers["routeguide"].addr)
    # A unary call brings the connection up; a stream stays open on it.
    rc, call = task(h, rt, op="start", conn=int(conn), path="/routeguide.RouteGuide/GetFeature",
                    body='{"latitude":409146138,"longitude":-746188906}')
    rc, answer = task(h, rt, op="next", id=int(call))
    assert (rc, end_of(answer)[1][b"grpc-status"]) == (0, b"0"), answer
    rc, call = task(h, rt, op="start", conn=int(conn), path="/routeguide.RouteGuide/RouteChat")
    assert rc == 0
    assert task(h, rt, op="send", id=int(call), body='{"message":"open"}') == (0, None)
    queued = [h.submit(rt, json.dumps({"op": "loadfile", "path": os.path.join(PROTOS, "helloworld.proto")})),
              h.submit(rt, json.dumps({"op": "next", "id": int(call), "timeout": 60000}))]
    assert h.shutdown(rt)
    assert h.wait(queued[0], timeout=5) == (0, None)
    assert h.wait(queued[1], timeout=5) == (1, b"the grpc-wasm runtime was unloaded")
    assert gone(threads) == threads
    assert len(os.listdir("/proc/self/fd")) == fds
    assert h.violations() == 0, h.last_violation()
    assert h.poll_after_null() == 0

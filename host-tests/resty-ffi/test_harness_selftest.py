"""Self-test of the lua-resty-ffi harness against fake_lib.c."""

import os
import subprocess

import pytest

from harness.resty_ffi import Harness, HarnessError

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def built(harness_build):
    out, harness = harness_build
    fake = out / "libfake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-o", str(fake),
                    os.path.join(HERE, "fake_lib.c")], check=True)
    return harness, fake


@pytest.fixture
def h(built):
    harness, _ = built
    harness.reset_counters()
    return harness


@pytest.fixture
def rt(built, h):
    runtime = built[1]
    handle = h.load(runtime, "my-cfg")
    yield handle
    assert h.shutdown(handle)


def test_echo(h, rt):
    assert h.call(rt, b"hello") == (0, b"HELLO")
    assert h.call(rt, b"a\0b") == (0, b"A\0B")  # length, not strlen
    assert h.call(rt, b"") == (0, b"")
    assert h.call(rt, None) == (0, None)
    assert Harness.as_lua(*h.call(rt, "ok")) == (True, b"OK", None)
    assert h.violations() == 0


def test_error_is_c_string_and_cfg_was_copied(h, rt):
    # rsp_len 0 means strlen; the text also proves the lib copied cfg
    # (the harness scribbled over its own copy after libffi_init).
    rc, rsp = h.call(rt, b"error please")
    assert (rc, rsp) == (1, b"failed: my-cfg")
    assert Harness.as_lua(rc, rsp) == (False, 1, b"failed: my-cfg")


def test_concurrent_submits(h, rt):
    tasks = [(i, h.submit(rt, b"req-%d" % i)) for i in range(200)]
    for i, t in tasks:
        assert h.wait(t) == (0, b"REQ-%d" % i)
    assert h.outstanding(rt) == 0
    assert h.violations() == 0


def test_clean_shutdown(h, built):
    handle = h.load(built[1], "x")
    pending = [h.submit(handle, b"p%d" % i) for i in range(5)]
    assert h.shutdown(handle)  # pending tasks are served before the NULL
    assert [h.wait(t) for t in pending] == [(0, b"P%d" % i) for i in range(5)]
    assert h.outstanding(handle) == 0
    assert h.poll_after_null() == 0
    assert h.violations() == 0
    with pytest.raises(HarnessError, match="finished"):
        h.submit(handle, b"late")


def test_init_failure(h, built):
    with pytest.raises(HarnessError, match="libffi_init returned 7"):
        h.load(built[1], "fail")
    with pytest.raises(HarnessError, match="dlopen"):
        h.load("/nonexistent/libnope.so")


def test_timeout_then_late_response_is_dropped(h, rt):
    with pytest.raises(TimeoutError):
        h.call(rt, b"slow", timeout=0.05)
    assert h.call(rt, b"next") == (0, b"NEXT")  # queued behind the slow one
    assert h.outstanding(rt) == 0
    assert h.violations() == 0


def test_detects_double_respond(h, rt):
    assert h.call(rt, b"dup") == (0, b"DUP")
    assert h.call(rt, b"sync") == (0, b"SYNC")  # the second respond happened by now
    assert h.violations() == 1
    assert "respond on task" in h.last_violation()


def test_detects_poll_after_null(h, built):
    handle = h.load(built[1], "repoll")
    assert h.shutdown(handle)
    assert h.poll_after_null() == 1

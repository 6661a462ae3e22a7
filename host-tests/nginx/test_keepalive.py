"""Dead connections (issue 14): a server that takes the TCP connection and
never speaks HTTP/2, and a connection whose traffic stops (a loopback relay
the test pauses). Calls end by their deadline or sooner, a dead connection
is found by its unanswered handshake or PING, and the next call after the
server is back succeeds; on both transports of the FFI path."""

import contextlib
import socket
import threading
import time
import urllib.parse

import pytest

from harness.nginx import Nginx, Server, check_log
from harness.paths import PROTOS
from harness.raw_h2 import RawH2


class Relay:
    """A loopback TCP relay to `target`; paused, it still accepts and reads
    but forwards nothing (a peer gone quiet without closing), and on resume
    it forwards what it held."""

    def __init__(self, target):
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        host, port = self.target.rsplit(":", 1)
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection((host, int(port)))
            self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self.pump, args=(src, dst), daemon=True).start()

    def pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def pause(self):
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def stop(self):
        self.flowing.set()
        self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.fixture(scope="module")
def greeter():
    server = Server("greeter-server")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nginx(greeter):
    proxy = Nginx({"protos": PROTOS}, workers=1)
    # The worker's first call loads the module: not a cost to measure.
    call(proxy, name="warm-up", addr="127.0.0.1:1", timeout=100)
    yield proxy
    proxy.stop()
    check_log(proxy)


def call(nginx, **args):
    """One call on the worker's conn named args["name"]: (outcome, err, ms)."""
    status, body = nginx.get("/t/keepalive?" + urllib.parse.urlencode(args), timeout=30)
    assert status == 200, body + nginx.log()[-3000:]
    outcome, text, ms = body.strip().split(" | ")
    return outcome, text, int(ms)


@pytest.mark.parametrize("transport", ["cosocket", "runtime"])
def test_a_server_that_never_answers_fails_the_call_by_its_deadline(nginx, transport):
    hole = RawH2("mute")
    try:
        # Default bounds (10 s): the call's own deadline ends it.
        late = call(nginx, name=f"hole-{transport}", addr=hole.addr, transport=transport, timeout=500)
        # A short handshake bound (and keepalive, for tonic's dial): the
        # connection is given up before the call's deadline.
        bounded = call(nginx, name=f"hole-bounded-{transport}", addr=hole.addr, transport=transport,
                       handshake=300, interval=200, ka_timeout=300, timeout=3000)
    finally:
        hole.stop()
    # The module's own deadline, or the runtime transport's: the same words.
    assert late[:2] == ("failed", "DEADLINE_EXCEEDED (4): deadline of 500 ms exceeded"), late
    # The defect waited out the 10 s handshake bound.
    assert 450 <= late[2] < 3000, late
    expected = {
        "cosocket": "UNAVAILABLE (14): the server did not answer the HTTP/2 handshake within 300 ms",
        # tonic's dial has nothing to wait for; hyper's keepalive PING finds
        # the server gone.
        "runtime": "UNAVAILABLE (14): the server did not answer a keepalive PING within 300 ms",
    }[transport]
    assert bounded[:2] == ("failed", expected), bounded
    # Before the call's 3 s deadline (the text above says which ended it).
    assert bounded[2] < 2500, bounded


@pytest.mark.parametrize("transport", ["cosocket", "runtime"])
def test_a_connection_gone_quiet_is_found_by_ping_and_redialled(nginx, greeter, transport):
    relay = Relay(greeter.addr)
    conn = dict(name=f"relay-{transport}", addr=relay.addr, transport=transport,
                interval=200, ka_timeout=300, handshake=500, timeout=3000)
    try:
        first = call(nginx, **conn)
        relay.pause()
        time.sleep(0.3)
        # The request is sent into the paused relay: the PING finds the
        # server gone, before the call's 3 s deadline.
        quiet = call(nginx, **conn)
        # Dialled again, through the relay that still holds everything.
        still = call(nginx, **conn)
        relay.resume()
        back = call(nginx, **conn)
    finally:
        relay.stop()
    name = conn["name"]
    assert first[:2] == ("ok", f"Hello {name}!"), first
    ping = "UNAVAILABLE (14): the server did not answer a keepalive PING within 300 ms"
    expected = {
        "cosocket": (ping, "UNAVAILABLE (14): the server did not answer the HTTP/2 handshake within 500 ms"),
        # A redial through the paused relay is found by the PING too.
        "runtime": (ping, ping),
    }[transport]
    assert (quiet[:2], still[:2]) == (("failed", expected[0]), ("failed", expected[1])), (quiet, still)
    # Before the calls' 3 s deadline (the texts above say which ended them).
    assert quiet[2] < 2500, (quiet, still)
    assert still[2] < 2500, (quiet, still)
    assert back[:2] == ("ok", f"Hello {name}!"), back
    print(f"{transport}: dead connection found in {quiet[2]} ms; "
          f"the redial through the quiet relay failed in {still[2]} ms")

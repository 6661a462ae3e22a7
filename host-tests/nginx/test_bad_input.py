"""Hostile input from a server, through resty.ffi.grpc in real nginx:
each bad answer fails its own call with a clear status, and the worker
serves the next call."""

import os

import pytest

from harness.nginx import HERE, Nginx, Server, check_log, free_port
from harness.paths import PROTOS

NESTING = "message nesting exceeds 100 levels"


@pytest.fixture(scope="module")
def nginx():
    testing = Server("testing-server")
    proxy = Nginx({"testing": testing.addr, "protos": PROTOS})
    yield proxy
    proxy.stop()
    testing.stop()
    check_log(proxy)


def test_deeply_nested_answers_fail_their_call_only(nginx):
    status, body = nginx.get("/t/nesting")
    assert status == 200, body + nginx.log()[-3000:]
    assert body.splitlines() == [
        f"reply 101: false | INTERNAL (13): cannot write grpcwasm.testing.NestReply as JSON: {NESTING} | 13",
        f"reply 5000: false | INTERNAL (13): cannot write grpcwasm.testing.NestReply as JSON: {NESTING} | 13",
        f"reply 20000: false | INTERNAL (13): cannot write grpcwasm.testing.NestReply as JSON: {NESTING} | 13",
        "details: false | INTERNAL (13): nested details | 13",
        "detail: type.googleapis.com/google.protobuf.Any true",
        "after: true type.googleapis.com/google.protobuf.Any type.googleapis.com/grpcwasm.testing.Empty",
    ], body


def test_a_stream_keeps_its_connection_when_the_conn_is_collected(nginx):
    status, body = nginx.get("/t/orphan_stream")
    assert (status, body) == (200, "0,1,2\n"), body + nginx.log()[-3000:]


PHASES = """
init_by_lua_file {lua}/phases_init.lua;
server {{
    listen 127.0.0.1:{port};
    location /phases {{
        content_by_lua_file {lua}/phases.lua;
        header_filter_by_lua_block {{
            local ok, err = ngx.ctx.conn:unary("/helloworld.Greeter/SayHello", {{name = "h"}})
            ngx.header["x-header-filter"] = tostring(ok) .. " " .. tostring(err)
        }}
        log_by_lua_block {{
            local ok, err = ngx.ctx.conn:unary("/helloworld.Greeter/SayHello", {{name = "l"}})
            ngx.log(ngx.WARN, "log phase call: ", tostring(ok), " ", tostring(err))
        }}
    }}
}}
"""


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_phases_that_cannot_yield_get_an_error_and_the_master_no_threads():
    greeter = Server("greeter-server")
    port = free_port()
    proxy = Nginx({"greeter": greeter.addr, "protos": PROTOS},
                  http_extra=PHASES.format(lua=os.path.join(HERE, "lua"), port=port))
    try:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/phases", timeout=20) as r:
            body, header = r.read().decode(), r.headers["x-header-filter"]
        assert body.splitlines() == [
            "init: true nil",
            "init loadfile: false grpc-wasm is not set up in init_by_lua: that is the master process, whose "
            "threads and sockets every worker would share; use init_worker_by_lua, or let the first call set "
            "the worker up",
            "content: true Hello content!",
        ], body
        refused = ("conn:unary cannot run in the {} phase, which cannot yield; call from rewrite, access, "
                   "content or a timer (ngx.timer.at)")
        assert header == "false " + refused.format("header_filter")
        assert threads(proxy.proc.pid) == 1
    finally:
        proxy.stop()
        greeter.stop()
    assert "log phase call: false " + refused.format("log") in proxy.log()
    check_log(proxy)

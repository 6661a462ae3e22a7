"""Hostile input from a server, through resty.ffi.grpc in real nginx:
each bad answer fails its own call with a clear status, and the worker
serves the next call."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from nginx_harness import PROTOS, Nginx, Server  # noqa: E402
from test_nginx import check_log  # noqa: E402

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

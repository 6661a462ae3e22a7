"""Envoy as the browser's and Node's gateway: its own grpc_web, cors and
connect_grpc_bridge filters (no grpc-wasm filter) in front of the test
servers, as users deploy it."""

import os
import re
import subprocess

from .envoy import Envoy, stop_process
from .paths import HOST_TESTS, PROTOS

# The headers a page may send and read cross-origin: gRPC-Web's and
# Connect's, plus the metadata the tests send.
ALLOW_HEADERS = ("content-type,x-grpc-web,x-user-agent,grpc-timeout,connect-protocol-version,"
                 "connect-timeout-ms,x-echo-one,x-who")
EXPOSE_HEADERS = "grpc-status,grpc-message,grpc-status-details-bin,x-echo-one"


def web_filters():
    def typed(name, type_url):
        return {"name": name, "typed_config": {"@type": type_url}}

    return [
        typed("envoy.filters.http.cors", "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"),
        typed("envoy.filters.http.grpc_web", "type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb"),
        typed("envoy.filters.http.connect_grpc_bridge",
              "type.googleapis.com/envoy.extensions.filters.http.connect_grpc_bridge.v3.FilterConfig"),
    ]


def cors_policy(origin_prefix):
    return {"typed_per_filter_config": {"envoy.filters.http.cors": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": [{"prefix": origin_prefix}],
        "allow_methods": "GET, POST, OPTIONS",
        "allow_headers": ALLOW_HEADERS,
        "expose_headers": EXPOSE_HEADERS,
        "max_age": "600",
    }}}


def web_envoy(servers):
    """Envoy routing each test service's path prefix to its server (those of
    testing, routeguide and greeter that `servers` has)."""
    prefixes = {"testing": "/grpcwasm.testing.", "routeguide": "/routeguide.", "greeter": "/helloworld."}
    clusters = [(prefixes[name], name, server.port) for name, server in servers.items() if name in prefixes]
    return Envoy(None, clusters, http_filters=web_filters(), virtual_host=cors_policy("http://127.0.0.1"))


class ConnectServer:
    """Connect's own Node server (connect_server.mjs) for the test services."""

    def __init__(self, descriptor_set):
        here = os.path.join(HOST_TESTS, "js")
        self.proc = subprocess.Popen(["node", os.path.join(here, "connect_server.mjs"), descriptor_set],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=here)
        line = self.proc.stdout.readline()
        match = re.match(r"listening on (\S+)", line)
        if not match:
            self.stop()
            raise RuntimeError(f"connect_server.mjs did not start: {line!r} {self.proc.stderr.read()}")
        self.url = f"http://{match.group(1)}"

    def stop(self):
        stop_process(self.proc)


def protoc_descriptor_set(out, *names):
    """The files with their imports, compiled by protoc (grpcio-tools), not by our compiler."""
    import grpc_tools
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{PROTOS}", f"-I{include}", "--include_imports", f"--descriptor_set_out={out}",
                      *names])
    assert rc == 0, f"protoc failed on {names}"
    return out

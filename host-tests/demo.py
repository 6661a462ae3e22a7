"""`make demo`: the hosts against the bundled test servers.

1. OpenResty's way in: the Lua program of the lua-shim issue, run by real
   nginx + lua-nginx-module through resty.ffi.grpc (LuaJIT FFI path).
2. Envoy: JSON to gRPC through the wasm filter, in transcoding mode (the
   route's upstream is the gRPC server) and in callout mode (the filter
   calls the server itself; a bodiless GET binding), and with no .proto at
   all: the filter asks the server's reflection service for its
   descriptors, and serves the OpenAPI document of what it learnt.
3. nginx + Kong's ngx_wasm_module: the same filter in front of grpc_pass,
   its configuration fetched over HTTP (scripts/build-ngx-wasm.sh builds
   that nginx once and caches it).
4. Node with the npm package (js/npm): gRPC-Web and Connect through
   Envoy's own filters, and native gRPC over node:http2
   (host-tests/js/demo.mjs, the README's Node example).

After the calls of nginx and of Envoy, a scrape of their metrics.
"""

import json
import os
import subprocess
import time
import urllib.request

from harness.envoy import Envoy, free_port, read_protos
from harness.nginx import Nginx, Server, ensure_certs
from harness.ngx_wasm import NgxWasm
from harness.paths import PROTOS, SHIM
from harness.web_envoy import web_envoy


def lua_demo(servers, certs):
    env = {name: s.addr for name, s in servers.items()}
    env.update(certs=certs, protos=PROTOS, shim=SHIM, dead="127.0.0.1:1")
    proxy = Nginx(env, workers=1, http_extra=METRICS)
    try:
        status, body = proxy.get("/t/program")
        print(f"== nginx + resty.ffi.grpc: GET /t/program (host-tests/nginx/lua/program.lua) -> {status}")
        print(body, end="")
        print_scrape("grpc.prometheus() in nginx (docs/operating.md)", f"http://127.0.0.1:{proxy.port}/t/metrics_scrape")
    finally:
        proxy.stop()


# The Lua metrics' shared dict, as the README's OpenResty example names it.
METRICS = """
lua_shared_dict grpc_metrics 1m;
init_by_lua_block { assert(require("resty.ffi.grpc").init{metrics_dict = "grpc_metrics"}) }
"""


def post(port, path, body, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def envoy_demo(servers):
    protos = read_protos("helloworld.proto", "library.proto")
    proxy = Envoy({"protos": protos}, [("/", "greeter", servers["greeter"].port)])
    try:
        print("== Envoy + grpc_wasm.wasm, transcoding mode")
        print("POST /helloworld.Greeter/SayHello {\"name\":\"envoy\"} ->",
              *post(proxy.port, "/helloworld.Greeter/SayHello", {"name": "envoy"}))
    finally:
        proxy.stop()
    proxy = Envoy({"protos": protos, "callout": {"upstream": "library"}},
                  [("/", "unused", free_port()), (None, "library", servers["library"].port)])
    try:
        print("== Envoy + grpc_wasm.wasm, callout mode (proxy_grpc_call)")
        print("GET /v1/shelves/1 ->", *post(proxy.port, "/v1/shelves/1", None, "GET"))
        print("GET /v1/shelves/0 ->", *post(proxy.port, "/v1/shelves/0", None, "GET"))
        print("POST /v1/shelves/1/books {\"title\":\"Dune\"} ->",
              *post(proxy.port, "/v1/shelves/1/books", {"title": "Dune"}))
        print_scrape("Envoy's /stats/prometheus (docs/operating.md)", f"http://127.0.0.1:{proxy.admin}/stats/prometheus")
    finally:
        proxy.stop()
    reflection_demo()


def reflection_demo():
    server = Server("library-server", "--reflection", "v1")
    proxy = Envoy({"reflection": {"upstream": "library"}, "openapi": {"path": "/openapi.json"}},
                  [("/", "library", server.port)])
    try:
        print("== Envoy + grpc_wasm.wasm, descriptors from the server's reflection service (no .proto)")
        started = time.time()
        answer = post(proxy.port, "/v1/shelves/2", None, "GET")
        while answer[0] == 503 and time.time() - started < 15:
            time.sleep(0.05)
            answer = post(proxy.port, "/v1/shelves/2", None, "GET")
        print(f"GET /v1/shelves/2 -> {answer[0]} {answer[1]} (first answered {time.time() - started:.2f} s "
              "after Envoy was ready)")
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/openapi.json", timeout=20) as r:
            document = json.loads(r.read())
        print(f"GET /openapi.json -> {r.status}, an OpenAPI {document['openapi']} document of "
              f"{len(document['paths'])} paths; its start:")
        start = {"openapi": document["openapi"], "info": document["info"],
                 "paths": dict(list(document["paths"].items())[:1])}
        print(json.dumps(start, indent=1)[:900] + "\n ...")
    finally:
        proxy.stop()
        server.stop()


def print_scrape(what, url):
    """The filter's counters in a scrape (histogram buckets left out), once
    the module has handed them over (at its next tick, within 50 ms)."""
    time.sleep(0.2)
    with urllib.request.urlopen(url, timeout=10) as r:
        lines = r.read().decode().splitlines()
    print(f"== metrics: {what}")
    for line in lines:
        if line.startswith(("grpc_client_started", "grpc_client_handled", "grpc_wasm_transcode")):
            print(line)


def ngx_wasm_demo(servers):
    protos = read_protos("helloworld.proto", "library.proto")
    proxy = NgxWasm({"protos": protos}, [("/helloworld.", "greeter", servers["greeter"].port),
                                         ("/", "library", servers["library"].port)])
    try:
        print("== nginx + ngx_wasm_module + grpc_wasm.wasm, transcoding in front of grpc_pass")
        print("POST /helloworld.Greeter/SayHello {\"name\":\"ngx_wasm_module\"} ->",
              *post(proxy.port, "/helloworld.Greeter/SayHello", {"name": "ngx_wasm_module"}))
        print("POST /v1/shelves {\"id\":\"7\",\"theme\":\"nginx\"} ->",
              *post(proxy.port, "/v1/shelves", {"id": "7", "theme": "nginx"}))
    finally:
        proxy.stop()


def node_demo(servers):
    proxy = web_envoy(servers)
    try:
        demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "demo.mjs")
        print("== Node + the npm package (js/npm): node host-tests/js/demo.mjs", flush=True)
        subprocess.run(["node", demo, f"http://127.0.0.1:{proxy.port}", f"http://{servers['routeguide'].addr}"],
                       check=True, timeout=60)
    finally:
        proxy.stop()


def main():
    certs = ensure_certs()
    servers = {
        "greeter": Server("greeter-server"),
        "routeguide": Server("routeguide-server"),
        "echo_mtls": Server("echo-server", "--tls-dir", certs, "--mtls"),
        "library": Server("library-server"),
    }
    try:
        lua_demo(servers, certs)
        envoy_demo(servers)
        ngx_wasm_demo(servers)
        node_demo(servers)
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()

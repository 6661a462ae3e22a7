"""The OpenAPI document the filter serves ("openapi" in its
configuration), in real Envoy: validated by openapi-spec-validator, built
with the options the filter runs with, kept fresh with descriptors from
reflection, and used by a client that openapi-python-client generated from
it. The transcoding suite (test_transcoder_differential.py) checks every
exchange against it."""

import importlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from openapi_spec_validator import validate as validate_spec

from harness.envoy import Envoy, Server
from harness.paths import PROTOS


def library_protos():
    with open(os.path.join(PROTOS, "library.proto")) as f:
        return {"library.proto": f.read()}


def get(proxy, path, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers.get("content-type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read()


@pytest.fixture(scope="module")
def library():
    server = Server("library-server", "--reflection", "v1")
    yield server
    server.stop()


def test_the_document_is_valid_openapi_and_names_every_binding(library):
    proxy = Envoy({"protos": library_protos(), "openapi": {"path": "/openapi.json", "title": "Library"}},
                  [("/", "library", library.port)])
    try:
        status, kind, body = get(proxy, "/openapi.json")
        assert (status, kind) == (200, "application/json"), body[:2000]
        document = json.loads(body)
        validate_spec(document)
        assert document["openapi"] == "3.1.0"
        assert document["info"]["title"] == "Library"
        paths = document["paths"]
        # 12 bindings, and each of the 11 methods at its own path.
        assert sorted(op for ops in paths.values() for op in ops) == (
            ["delete"] + ["get"] * 6 + ["head", "patch"] + ["post"] * 14)
        assert paths["/v1/shelves/{name_1}/books/{name_2}:move"]["post"]["operationId"] == \
            "example_library_v1_Library_MoveBook"
        # A query string does not change the answer; HEAD has no body.
        assert get(proxy, "/openapi.json?x=1")[2] == body
        assert get(proxy, "/openapi.json", "HEAD")[:2] == (200, "application/json")
        # The same bytes on every request: built once per configuration.
        assert get(proxy, "/openapi.json")[2] == body
    finally:
        proxy.stop()


def test_the_document_follows_the_print_options(library):
    proxy = Envoy({"protos": library_protos(), "openapi": {"path": "/api"},
                   "print_options": {"preserve_proto_field_names": True}},
                  [("/", "library", library.port)])
    try:
        document = json.loads(get(proxy, "/api")[2])
        validate_spec(document)
        book = document["components"]["schemas"]["example.library.v1.Book"]["properties"]
        page = document["components"]["schemas"]["example.library.v1.Page"]["properties"]
        assert "page_token" in page or "token" in page
        assert set(book) >= {"name", "title"}
    finally:
        proxy.stop()


def test_without_openapi_the_path_is_not_served(library):
    proxy = Envoy({"protos": library_protos()}, [("/", "library", library.port)])
    try:
        status, _, body = get(proxy, "/openapi.json")
        assert status == 404, body[:500]
    finally:
        proxy.stop()


def test_a_reflection_only_filter_serves_the_reflected_services(library):
    proxy = Envoy({"reflection": {"upstream": "library"}, "openapi": {"path": "/openapi.json"}},
                  [("/", "library", library.port)])
    try:
        for _ in range(100):
            status, _, body = get(proxy, "/openapi.json")
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200, body[:500]
        document = json.loads(body)
        validate_spec(document)
        assert "/v1/shelves/{shelf}" in document["paths"]
    finally:
        proxy.stop()


def test_a_client_generated_from_the_document_calls_through_envoy(library, tmp_path):
    """openapi-python-client writes a client from what the filter serves;
    its calls (a path variable, one over several segments, a body, an
    error) reach the server and read back as its typed models."""
    proxy = Envoy({"protos": library_protos(), "openapi": {"path": "/openapi.json", "title": "Library"}},
                  [("/", "library", library.port)])
    try:
        (tmp_path / "openapi.json").write_bytes(get(proxy, "/openapi.json")[2])
        out = subprocess.run(["openapi-python-client", "generate", "--path", str(tmp_path / "openapi.json"),
                              "--output-path", str(tmp_path / "client")], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        # Only the NDJSON streams are beyond it (3.1 has no schema for a stream's items).
        assert (out.stdout + out.stderr).count("WARNING parsing") == 2, out.stdout + out.stderr
        sys.path.insert(0, str(tmp_path / "client"))
        try:
            package = "library_client.api.example_library_v_1_library.example_library_v_1_library_"
            api = {name: importlib.import_module(package + name)
                   for name in ("get_shelf", "get_book", "create_shelf", "create_book")}
            client = importlib.import_module("library_client").Client(base_url=f"http://127.0.0.1:{proxy.port}")
            models = importlib.import_module("library_client.models")
            shelf = api["get_shelf"].sync(shelf="7", client=client)
            assert (type(shelf).__name__, shelf.id, shelf.theme) == ("Shelf", "7", "theme-7")
            made = api["create_book"].sync(shelf="9", client=client, body=models.Book(title="Dune"))
            assert (type(made).__name__, made.name, made.title) == ("Book", "shelves/9/books/1", "Dune")
            book = api["get_book"].sync(name_1="9", name_2="1", client=client)
            assert (type(book).__name__, book.name, book.title) == ("Book", "shelves/9/books/1", "Dune")
            created = api["create_shelf"].sync(client=client, body=models.Shelf(id="3", theme="poetry"))
            assert (created.id, created.theme) == ("3", "poetry")
            missing = api["get_shelf"].sync(shelf="0", client=client)
            assert (type(missing).__name__, missing.code, missing.message) == ("Status", 5, "no shelf 0")
        finally:
            sys.path.remove(str(tmp_path / "client"))
            for name in [m for m in sys.modules if m.startswith("library_client")]:
                del sys.modules[name]
    finally:
        proxy.stop()


# grpc-gateway's own document for the same bindings (its generated
# flow_combination.swagger.json, OpenAPI 2): each operation's method,
# path and parameters, where a path parameter is named by its field and
# "body" stands for a request body of any name.
GATEWAY_OPERATIONS = {
    ("POST", "/rpc/empty/rpc"): [],
    ("POST", "/stream/empty/rpc"): [],
    ("POST", "/rpc/body/rpc"): [("body", "body")],
    ("POST", "/rpc/path/{}/{}/{}/rpc"): [("a", "path"), ("b", "path"), ("c", "path")],
    ("POST", "/rpc/query/rpc"): [("a", "query"), ("b", "query"), ("c", "query")],
    ("POST", "/rpc/body/path/{}/{}/rpc"): [("a", "path"), ("b", "path"), ("body", "body")],
    ("POST", "/rpc/body/query/rpc"): [("a", "query"), ("b", "query"), ("body", "body")],
    ("POST", "/rpc/body/path/{}/query/rpc"): [("a", "path"), ("b", "query"), ("body", "body")],
    ("POST", "/rpc/path/{}/query/rpc"): [("a", "path"), ("b", "query"), ("c", "query")],
    ("POST", "/rpc/path-nested/{}/rpc"): [("a.str", "path")],
    ("POST", "/rpc/path-nested/{}/{}/rpc"): [("a.str", "path"), ("b", "path"), ("body", "body")],
    ("POST", "/rpc/path-nested1/{}/rpc"): [("a.str", "path"), ("b", "query"), ("c", "query")],
    ("POST", "/rpc/path-nested2/{}/rpc"): [("a.str", "path"), ("b", "query"), ("body", "body")],
}


def our_operations(document):
    """Each binding's operation as GATEWAY_OPERATIONS has them; the
    methods at their own gRPC paths (which grpc-gateway does not serve)
    apart."""
    out = {}
    for path, operations in document["paths"].items():
        if path.startswith("/gatewaycases."):
            continue
        for method, operation in operations.items():
            params = [(p["description"].strip("`") if p["in"] == "path" else p["name"], p["in"])
                      for p in operation.get("parameters", [])]
            if "requestBody" in operation:
                params.append(("body", "body"))
            out[(method.upper(), re.sub(r"\{[^}]+\}", "{}", path))] = sorted(params)
    return out


def test_the_operations_agree_with_grpc_gateway_s_for_the_same_bindings(library):
    with open(os.path.join(os.path.dirname(__file__), "data", "flow_combination.proto")) as f:
        protos = {"flow_combination.proto": f.read()}
    proxy = Envoy({"protos": protos, "openapi": {"path": "/openapi.json"}}, [("/", "library", library.port)])
    try:
        document = json.loads(get(proxy, "/openapi.json")[2])
        validate_spec(document)
        assert our_operations(document) == {k: sorted(v) for k, v in GATEWAY_OPERATIONS.items()}
        # The one difference: every method is also at its own path, as the filter serves it.
        assert sorted(p for p in document["paths"] if p.startswith("/gatewaycases.")) == [
            "/gatewaycases.FlowCombination/" + m for m in
            ("RpcBodyRpc", "RpcEmptyRpc", "RpcPathNestedRpc", "RpcPathSingleNestedRpc", "StreamEmptyRpc")]
    finally:
        proxy.stop()

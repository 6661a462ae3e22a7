"""The OpenAPI document the filter serves ("openapi" in its
configuration), in real Envoy: validated by openapi-spec-validator, built
with the options the filter runs with, kept fresh with descriptors from
reflection, and refused where it cannot be served. The transcoding suite
(test_transcoder_differential.py) checks every exchange against it."""

import json
import os
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

"""Every binding of a method reaches the same filters and the same cluster
as a transcoded request with a body, in Envoy itself.

A request without a body (and one answered by a google.api.HttpBody) cannot
go on as itself: Envoy lets no filter add a body. The filter calls the
method itself, back through the loopback cluster: an internal listener with
the same filter chain and routes (harness.loopback, as grpc-wasm-config
writes it). These tests put real filters after grpc-wasm (RBAC, ext_authz
with an authorization server of our own, routes by prefix, virtual hosts by
authority) and check what each binding meets. Without the loopback the
filter's call went to the route's cluster and skipped them all."""

import base64
import http.client
import http.server
import json
import threading

import pytest

from harness.envoy import LOOPBACK, Envoy, envoy_config, free_port, scratch_dir, wasm_filter
from harness.shelves_server import SERVICE, ShelvesServer, descriptor_set

# (name, HTTP method, path, JSON body or None, the gRPC method it calls).
BINDINGS = [
    ("post", "POST", "/shelves/1/books", {"title": "Dune"}, "CreateBook"),
    ("get", "GET", "/shelves/1", None, "GetShelf"),
    ("delete", "DELETE", "/shelves/1", None, "DeleteShelf"),
    ("http-body", "GET", "/download/1", None, "Download"),
    ("server-stream", "GET", "/shelves/1/books?count=2", None, "StreamBooks"),
    ("bodiless-post", "POST", "/shelves/1:archive", None, "ArchiveShelf"),
]
# Search's four bindings: two with a body, two without.
SEARCH = [
    ("GET", "/search?query=a", None),
    ("POST", "/search", {"query": "a"}),
    ("GET", "/search/ann/1999", None),
    ("POST", "/search/a", {"author": "ann"}),
]


@pytest.fixture(scope="module")
def shelves():
    directory = scratch_dir("grpc-wasm-chain-")
    path = descriptor_set(directory)
    with open(path, "rb") as f:
        encoded = base64.b64encode(f.read()).decode()
    servers = [ShelvesServer(path), ShelvesServer(path)]
    yield {"descriptor_set": encoded, "services": [SERVICE]}, servers
    for server in servers:
        server.stop()


def request(proxy, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    conn.request(method, path, data, {"content-type": "application/json", **(headers or {})})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def calls(server):
    """The gRPC methods the server was called with, in order."""
    with server.lock:
        return [method for received in server.received.values() for method, _ in received]


def forget(*servers):
    for server in servers:
        with server.lock:
            server.received.clear()


def rbac_denying(methods):
    paths = [{"url_path": {"path": {"exact": f"/{SERVICE}/{m}"}}} for m in methods]
    return {"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": {"action": "DENY", "policies": {"denied-methods": {
            "permissions": [{"or_rules": {"rules": paths}}], "principals": [{"any": True}]}}}}}


def with_filters_after(config, filters):
    """The grpc-wasm filter, then `filters`, in every listener's chain."""
    return [wasm_filter(config), *filters]


def test_rbac_after_the_filter_denies_a_method_through_every_binding(shelves):
    config, (server, _) = shelves
    denied = [m for *_, m in BINDINGS] + ["Search"]
    proxy = Envoy(None, [("/", "bookstore", server.port)],
                  http_filters=with_filters_after(config, [rbac_denying(denied)]))
    try:
        forget(server)
        # RBAC answers a request that came with a body as it came (HTTP
        # 403, which the filter names by its cause), the filter's own call
        # as gRPC (PERMISSION_DENIED): the same status either way.
        said = {True: "HTTP status 403 from a non-gRPC response: rbac_access_denied_matched_policy[denied-methods]",
                False: "RBAC: access denied"}
        for name, method, path, body, _ in BINDINGS:
            status, answer = request(proxy, method, path, body)
            assert (name, status, answer) == (
                name, 403, {"code": 7, "message": said[body is not None], "details": []}), proxy.log()
        for method, path, body in SEARCH:
            status, answer = request(proxy, method, path, body)
            assert (method, path, status, answer["message"]) == (method, path, 403, said[body is not None])
        assert calls(server) == []
        # A method the rule does not name goes through, without a body too.
        status, answer = request(proxy, "GET", "/shelves")
        assert (status, len(answer["shelves"])) == (200, 2), answer
        assert calls(server) == ["ListShelves"]
    finally:
        proxy.stop()


class Authorizer:
    """An HTTP authorization server for Envoy's ext_authz: it records what
    it was asked, and denies DeleteShelf and any request without a token."""

    def __init__(self):
        self.seen = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def check(self):
                token = self.headers.get("authorization")
                owner.seen.append((self.command, self.path, token))
                allowed = token == "Bearer alice" and not self.path.endswith("/DeleteShelf")
                self.send_response(200 if allowed else 403)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = check

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def ext_authz(port):
    def edit(config):
        config["static_resources"]["clusters"].append({
            "name": "authz", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "authz", "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}})
    authz = {"name": "envoy.filters.http.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "http_service": {"server_uri": {"uri": f"http://127.0.0.1:{port}", "cluster": "authz", "timeout": "2s"},
                         "path_prefix": "/check"}}}
    return authz, edit


def test_ext_authz_after_the_filter_sees_every_binding_as_its_grpc_method(shelves):
    config, (server, _) = shelves
    authorizer = Authorizer()
    authz, edit = ext_authz(authorizer.port)
    proxy = Envoy(None, [("/", "bookstore", server.port)],
                  http_filters=with_filters_after(config, [authz]), edit=edit)
    try:
        forget(server)
        for name, method, path, body, grpc_method in BINDINGS:
            authorizer.seen.clear()
            status, answer = request(proxy, method, path, body, {"authorization": "Bearer alice"})
            # Each request is checked once, as its gRPC method, with the
            # client's own credentials.
            assert authorizer.seen == [("POST", f"/check/{SERVICE}/{grpc_method}", "Bearer alice")], name
            expected = 403 if grpc_method == "DeleteShelf" else 200
            assert (name, status) == (name, expected), (answer, proxy.log())
        assert calls(server) == ["CreateBook", "GetShelf", "Download", "StreamBooks", "ArchiveShelf"]
        authorizer.seen.clear()
        status, _ = request(proxy, "GET", "/shelves/1")
        assert (status, authorizer.seen) == (403, [("POST", f"/check/{SERVICE}/GetShelf", None)])
    finally:
        proxy.stop()
        authorizer.stop()


def test_routes_by_prefix_send_every_binding_of_a_method_to_the_same_cluster(shelves):
    config, (server, other) = shelves
    # REST paths under /shelves would go to `other`; a transcoded request is
    # routed again by its gRPC path, to `bookstore`, and so must the rest.
    def download_too(envoy):
        for listener in envoy["static_resources"]["listeners"]:
            manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
            routes = manager["route_config"]["virtual_hosts"][0]["routes"]
            routes.insert(0, {"match": {"prefix": "/download/"}, "route": {"cluster": "other"}})

    proxy = Envoy(config, [("/shelves/", "other", other.port), ("/", "bookstore", server.port)], edit=download_too)
    try:
        forget(server, other)
        for name, method, path, body, _ in BINDINGS:
            status, answer = request(proxy, method, path, body)
            assert (name, status) == (name, 200), (answer, proxy.log())
        assert calls(other) == []
        assert calls(server) == [m for *_, m in BINDINGS]
    finally:
        proxy.stop()


def test_the_loopback_call_keeps_the_requests_authority_and_so_its_virtual_host(shelves):
    config, (server, other) = shelves

    def by_authority(envoy):
        for listener in envoy["static_resources"]["listeners"]:
            manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
            manager["route_config"]["virtual_hosts"] = [
                {"name": "books", "domains": ["books.example"],
                 "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "bookstore"}}]},
                {"name": "rest", "domains": ["*"],
                 "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "other"}}]}]

    proxy = Envoy(config, [(None, "other", other.port), (None, "bookstore", server.port)], edit=by_authority)
    try:
        forget(server, other)
        for name, method, path, body, _ in BINDINGS:
            status, answer = request(proxy, method, path, body, {"host": "books.example"})
            assert (name, status) == (name, 200), (answer, proxy.log())
        assert (calls(other), calls(server)) == ([], [m for *_, m in BINDINGS])
    finally:
        proxy.stop()


def rbac_allowing_remote_ip(*cidrs):
    principals = [{"remote_ip": {"address_prefix": prefix, "prefix_len": length}} for prefix, length in cidrs]
    return {"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": {"action": "ALLOW", "policies": {"from": {
            "permissions": [{"any": True}], "principals": principals}}}}}


# A loopback client: Envoy writes its own address (192.0.2.2 here) into
# x-forwarded-for for a peer on 127.0.0.0/8, which the loopback's chain
# then reads as the client's. A real client's address is written as itself.
LOCAL_CLIENT = [("127.0.0.1", 32), ("192.0.2.2", 32)]


def edge_ingress(envoy):
    """The ingress as an edge proxy: the client's address is its peer's
    (`use_remote_address`, as grpc-wasm-config writes it); the loopback's
    chain reads it from the x-forwarded-for the ingress wrote."""
    ingress = envoy["static_resources"]["listeners"][0]
    ingress["filter_chains"][0]["filters"][0]["typed_config"]["use_remote_address"] = True


@pytest.mark.parametrize(("allowed", "status"), [(LOCAL_CLIENT, 200), ([("10.0.0.0", 8)], 403)],
                         ids=["the-client-allowed", "another-network-allowed"])
def test_rules_on_the_clients_address_hold_through_the_loopback_and_cannot_be_smuggled(shelves, allowed, status):
    config, (server, _) = shelves
    proxy = Envoy(None, [("/", "bookstore", server.port)],
                  http_filters=with_filters_after(config, [rbac_allowing_remote_ip(*allowed)]),
                  edit=edge_ingress)
    try:
        for name, method, path, body, _ in BINDINGS:
            got, answer = request(proxy, method, path, body)
            assert (name, got) == (name, status), (answer, proxy.log())
            # A grpc-metadata-* header stays itself: unwrapped into the
            # loopback call, it would add to the x-forwarded-for the rule
            # reads (and to any header the proxy set or checked).
            headers = {"x-forwarded-for": "1.1.1.1", "grpc-metadata-x-forwarded-for": "10.1.2.3"}
            got, answer = request(proxy, method, path, body, headers)
            assert (name, "smuggled", got) == (name, "smuggled", status), answer
    finally:
        proxy.stop()


def test_an_authority_that_names_no_host_is_refused_not_held(shelves):
    """Envoy keeps a gRPC client per distinct authority for a while: the
    loopback call takes only a host[:port] of at most 255 bytes."""
    config, (server, _) = shelves
    proxy = Envoy(config, [("/", "bookstore", server.port)])
    try:
        status, answer = request(proxy, "GET", "/shelves/1", headers={"host": "a" * 256})
        assert (status, answer["code"]) == (400, 3), answer
        assert answer["message"].startswith("the request's authority 'aaaa"), answer
        status, _ = request(proxy, "GET", "/shelves/1", headers={"host": "Books.Example:8080"})
        assert status == 200
    finally:
        proxy.stop()


def test_without_a_loopback_cluster_bodiless_bindings_are_refused_and_logged_once(shelves):
    config, (server, _) = shelves
    proxy = Envoy({**config, "loopback_cluster": None}, [("/", "bookstore", server.port)])
    try:
        forget(server)
        status, answer = request(proxy, "POST", "/shelves/1/books", {"title": "Dune"})
        assert status == 200, answer
        for name, method, path, body, _ in BINDINGS[1:]:
            status, answer = request(proxy, method, path, body)
            assert (name, status, answer["code"]) == (name, 501, 12)
            assert "without \"loopback_cluster\" that call would skip the filters after grpc-wasm" in answer["message"]
        assert calls(server) == ["CreateBook"]
    finally:
        proxy.stop()
    # Envoy writes its log file at intervals: read it once Envoy is gone.
    with open(proxy.log_path) as f:
        log = f.read()
    # One line per load of the configuration (each VM, each filter).
    loads = log.count("grpc-wasm: configured")
    assert loads >= 1, log
    assert log.count('grpc-wasm: no "loopback_cluster"') == loads, log


def test_the_loopback_is_an_internal_listener_no_client_can_reach():
    config = envoy_config(free_port(), free_port(), {"protos": {}}, [("/", "a", free_port())])
    inner = next(each for each in config["static_resources"]["listeners"] if each["name"] == LOOPBACK)
    assert "address" not in inner
    assert inner["internal_listener"] == {}

"""Descriptors from the upstream's reflection service, in real Envoy: a
filter configured with only "reflection" transcodes, follows a server that
changed, waits (503) while the server is away, and refuses what a hostile
reflection server sends without losing the set it runs with."""

import base64
import contextlib
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from concurrent import futures

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from harness.envoy import Envoy, Server, free_port, scratch_dir, validate
from harness.shelves_server import SERVICE, ShelvesServer
from harness.shelves_server import descriptor_set as shelves_descriptor_set
from harness.throughput import descriptor_set

LOADED = "descriptors loaded through reflection"
# Each of Envoy's VMs loads its own set: the main thread's and the one
# worker's (--concurrency 1).
VMS = 2


def send(proxy, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture
def started():
    """Starts what a test runs (servers, proxies); each is stopped after
    the test, in reverse order, even when a later one fails to start."""
    with contextlib.ExitStack() as stack:
        def start(thing):
            stack.callback(thing.stop)
            return thing
        yield start


def reflecting_envoy(cluster_port, **reflection):
    """Envoy whose route and reflection upstream are one cluster."""
    return Envoy({"reflection": {"upstream": "upstream", **reflection}}, [("/", "upstream", cluster_port)])


def wait_for(proxy, what, timeout=15):
    """Waits until `what()` is true (a load can take a tick and a backoff)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if what():
            return
        time.sleep(0.1)
    raise AssertionError(f"not so after {timeout} s:\n{proxy.log()[-4000:]}")


def whole_log(proxy):
    """All of Envoy's log (`proxy.log()` keeps its end only, for reports)."""
    with open(proxy.log_path) as f:
        return f.read()


def loads(proxy):
    return whole_log(proxy).count(LOADED)


def say_hello(proxy):
    return send(proxy, "POST", "/helloworld.Greeter/SayHello", {"name": "ann"})


def test_reflection_alone_transcodes_a_method_and_a_binding_from_v1(started):
    server = started(Server("library-server", "--reflection", "v1"))
    proxy = started(reflecting_envoy(server.port))
    wait_for(proxy, lambda: loads(proxy) >= VMS)
    assert "(grpc.reflection.v1.ServerReflection): 1 services" in proxy.log()
    # The google.api.http options came through reflection.
    assert send(proxy, "GET", "/v1/shelves/1") == (200, {"id": "1", "theme": "theme-1"})
    status, body = send(proxy, "POST", "/example.library.v1.Library/GetShelf", {"shelf": "2"})
    assert (status, body) == (200, {"id": "2", "theme": "theme-2"})


def test_a_v1alpha_server_is_asked_again_on_v1alpha(started):
    server = started(Server("greeter-server", "--reflection", "v1alpha"))
    proxy = started(reflecting_envoy(server.port))
    wait_for(proxy, lambda: loads(proxy) >= VMS)
    assert "(grpc.reflection.v1alpha.ServerReflection)" in proxy.log()
    assert say_hello(proxy) == (200, {"message": "Hello ann!"})


def test_until_the_first_load_json_gets_503_grpc_passes_and_then_it_recovers(started):
    port = free_port()
    proxy = started(reflecting_envoy(port))
    status, body = say_hello(proxy)
    assert status == 503
    assert body == {"code": 14, "message": "grpc-wasm: descriptors not loaded yet (the proxy's log says why)",
                    "details": []}
    wait_for(proxy, lambda: "grpc-wasm: reflection:" in proxy.log())
    assert "transcoded requests get 503 until a load succeeds; trying again in 1000 ms" in proxy.log()
    # The server comes up on the cluster's port: the next try loads.
    started(Server("greeter-server", "--reflection", "both", port=port))
    wait_for(proxy, lambda: loads(proxy) >= VMS)
    assert say_hello(proxy) == (200, {"message": "Hello ann!"})


def test_a_native_grpc_call_passes_before_the_first_load(started):
    greeter = started(Server("greeter-server"))
    dead = free_port()
    proxy = started(Envoy({"reflection": {"upstream": "reflection"}},
                          [("/", "greeter", greeter.port), (None, "reflection", dead)]))
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
    call = channel.unary_unary("/helloworld.Greeter/SayHello")
    # HelloRequest{name: "bo"} and HelloReply{message: "Hello bo!"}.
    assert call(b"\x0a\x02bo", timeout=10) == b"\x0a\x09Hello bo!"
    channel.close()
    assert say_hello(proxy)[0] == 503


def test_a_refresh_follows_a_server_that_gained_a_service(started):
    port = free_port()
    first = started(Server("greeter-server", "--reflection", "v1", port=port))
    proxy = started(reflecting_envoy(port, refresh_s=1))
    wait_for(proxy, lambda: loads(proxy) >= VMS)
    assert say_hello(proxy) == (200, {"message": "Hello ann!"})
    status, _ = send(proxy, "POST", "/example.library.v1.Library/GetShelf", {"shelf": "1"})
    assert status == 404
    # Restarted with another set: the library, and no greeter.
    first.stop()
    started(Server("library-server", "--reflection", "v1", port=port))
    wait_for(proxy, lambda: send(proxy, "POST", "/example.library.v1.Library/GetShelf",
                                 {"shelf": "1"})[0] == 200)
    assert send(proxy, "GET", "/v1/shelves/1") == (200, {"id": "1", "theme": "theme-1"})


def test_a_grpcio_server_s_descriptors_transcode_as_the_same_set_given_inline(started):
    """The second stack: grpcio-reflection (v1alpha), from a pool protoc
    compiled; each request answers as through a filter given that set."""
    directory = scratch_dir("grpc-wasm-shelves-")
    path = shelves_descriptor_set(directory)
    server = started(ShelvesServer(path, reflection=True))
    with open(path, "rb") as f:
        inline = base64.b64encode(f.read()).decode()
    reflecting = started(Envoy({"reflection": {"upstream": "shelves", "services": [SERVICE]}},
                               [("/", "shelves", server.port)]))
    given = started(Envoy({"descriptor_set": inline}, [("/", "shelves", server.port)]))
    wait_for(reflecting, lambda: loads(reflecting) >= VMS)
    assert "(grpc.reflection.v1alpha.ServerReflection): 1 services" in whole_log(reflecting)
    cases = [("POST", "/shelves/1/books", {"title": "Dune", "author": "Herbert"}),
             ("GET", "/search?q=dune&tags=a&tags=b", None),
             ("GET", "/v2/shelves/3/books/4", None),
             ("PATCH", "/shelves/1/books/5", {"title": "Emma"}),
             ("GET", "/shelves/x", None)]
    for method, request_path, body in cases:
        expected = send(given, method, request_path, body)
        assert send(reflecting, method, request_path, body) == expected, (method, request_path)
    assert send(reflecting, "POST", "/shelves/1/books", {"title": "Dune"})[0] == 200


class Rogue:
    """A reflection server (grpcio, v1 and v1alpha) that answers as the
    test says: `good` serves helloworld.proto as protoc compiled it;
    `files` serves the files it holds whatever is asked."""

    def __init__(self, good_set):
        self.good = {f.name: f for f in good_set.file}
        self.files = None
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.stream_stream_rpc_method_handler(self.info)
        for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
            self.server.add_generic_rpc_handlers(
                [grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def info(self, requests, context):
        for raw in requests:
            request = reflection_pb2.ServerReflectionRequest.FromString(raw)
            response = reflection_pb2.ServerReflectionResponse(original_request=request)
            kind = request.WhichOneof("message_request")
            if kind == "list_services":
                response.list_services_response.service.add(name="helloworld.Greeter")
            elif self.files is not None:
                response.file_descriptor_response.file_descriptor_proto.extend(
                    f.SerializeToString() for f in self.files)
            elif kind == "file_by_filename" and request.file_by_filename in self.good:
                response.file_descriptor_response.file_descriptor_proto.append(
                    self.good[request.file_by_filename].SerializeToString())
            else:
                response.file_descriptor_response.file_descriptor_proto.append(
                    self.good["helloworld.proto"].SerializeToString())
            yield response.SerializeToString()

    def stop(self):
        self.server.stop(0)


def rogue_file(name, imports=(), field_type=None, public=False):
    f = descriptor_pb2.FileDescriptorProto(name=name, package="rogue", syntax="proto3", dependency=list(imports))
    if public:
        f.public_dependency.extend(range(len(imports)))
    message = f.message_type.add(name="M" + name.split(".")[0].upper())
    if field_type:
        message.field.add(name="x", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                          type_name=field_type, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return f


@pytest.fixture(scope="module")
def rogue():
    directory = scratch_dir("grpc-wasm-rogue-")
    with open(descriptor_set(directory), "rb") as f:
        good = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    with contextlib.ExitStack() as stack:
        server = Rogue(good)
        stack.callback(server.stop)
        greeter = Server("greeter-server")
        stack.callback(greeter.stop)
        proxy = Envoy({"reflection": {"upstream": "reflection", "refresh_s": 1}},
                      [("/", "greeter", greeter.port), (None, "reflection", server.port)])
        stack.callback(proxy.stop)
        wait_for(proxy, lambda: loads(proxy) >= VMS)
        yield server, proxy


@pytest.mark.parametrize(("files", "why"), [
    ([rogue_file("a.proto", ["b.proto"]), rogue_file("b.proto", ["a.proto"])],
     "the server's files import each other in a cycle: a.proto -> b.proto -> a.proto"),
    ([rogue_file(f"f{i}.proto") for i in range(1100)],
     "the server's answer to service 'helloworld.Greeter' is over the limit of 1024 files"),
    ([rogue_file("bad.proto", field_type=".rogue.Nowhere")],
     "reflection: the server's files: invalid file descriptor set:"),
    # Each file imports every earlier one publicly: prost-reflect alone
    # would take time doubling with each file.
    ([rogue_file(f"p{i}.proto", [f"p{j}.proto" for j in range(i)], public=True) for i in range(40)],
     "its public imports take more than 100000 steps to follow"),
    ([rogue_file("other.proto")], "service 'helloworld.Greeter': the server's files do not define it"),
], ids=["cycle", "too-many-files", "does-not-compile", "public-imports", "another-file"])
def test_a_hostile_answer_is_refused_and_the_running_set_stays(rogue, files, why):
    server, proxy = rogue
    failures = whole_log(proxy).count("grpc-wasm: reflection:")
    server.files = files
    try:
        wait_for(proxy, lambda: whole_log(proxy).count("grpc-wasm: reflection:") > failures)
        assert why in proxy.log()
        assert "the descriptors loaded before stay" in proxy.log()
        assert say_hello(proxy) == (200, {"message": "Hello ann!"})
    finally:
        server.files = None
    # The next good load is taken again.
    loaded = loads(proxy)
    wait_for(proxy, lambda: loads(proxy) >= loaded + VMS)


def test_bad_options_are_refused_at_load():
    code, out = validate({"reflection": {"upstream": "x", "grpc_service": "eA=="}})
    assert code != 0
    assert "reflection: give exactly one of \"upstream\" (a cluster name) or \"grpc_service\"" in out
    code, out = validate({"reflection": {"upstream": "x", "services": []}})
    assert code != 0
    assert "reflection.services: name at least one service" in out



def grpcurl(port, method, request):
    """grpcurl's answer through its own reflection client (v1alpha): the
    messages as JSON values, or (code name, message) of its error."""
    out = subprocess.run(["grpcurl", "-plaintext", "-d", json.dumps(request), f"127.0.0.1:{port}", method],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        code = re.search(r"Code: (\w+)", out.stderr)
        message = re.search(r"Message: (.*)", out.stderr)
        assert code, out.stderr
        assert message, out.stderr
        return code.group(1), message.group(1)
    # One JSON document per message, one after another.
    messages, rest = [], out.stdout.lstrip()
    while rest:
        value, used = json.JSONDecoder().raw_decode(rest)
        messages.append(value)
        rest = rest[used:].lstrip()
    return messages


# grpcurl's code names (Go's) for the codes these calls end with.
GO_CODE_NAMES = {5: "NotFound", 3: "InvalidArgument"}


@pytest.mark.parametrize(("method", "request_json"), [
    ("GetShelf", {"shelf": "1"}),
    ("GetBook", {"name": "shelves/1/books/2"}),
    ("ListBooks", {"shelf": "1", "page": {"size": 2}}),
    ("SearchBooks", {"query": "a"}),
    ("StreamBooks", {"shelf": "1"}),
    ("GetShelf", {"shelf": "0"}),
])
def test_grpcurl_and_the_filter_answer_alike_from_reflection_alone(started, method, request_json):
    """grpcurl as the peer: the same server, each side with only what
    reflection told it; the answers are equal as JSON values."""
    server = started(Server("library-server", "--reflection", "both"))
    proxy = started(reflecting_envoy(server.port))
    wait_for(proxy, lambda: loads(proxy) >= VMS)
    theirs = grpcurl(server.port, f"example.library.v1.Library/{method}", request_json)
    req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/example.library.v1.Library/{method}",
                                 data=json.dumps(request_json).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            body = r.read().decode()
        ours = [json.loads(line) for line in body.splitlines() if line.strip()]
    except urllib.error.HTTPError as e:
        error = json.loads(e.read())
        ours = (GO_CODE_NAMES[error["code"]], error["message"])
    assert ours == theirs

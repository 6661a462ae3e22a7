"""conn:reflect in real nginx: services from the server's own reflection
(tonic's v1 and v1alpha, grpcio's as a second stack), then calls of every
kind with no .proto file; what is loaded listed and described as grpcurl
lists and describes it, and the same calls answered alike."""

import json
import os
import re
import subprocess
import urllib.parse

import pytest
from openapi_spec_validator import validate as validate_spec

from harness.nginx import Nginx, Server, check_log, scratch_dir
from harness.paths import PROTOS
from harness.shelves_server import ShelvesServer, descriptor_set
from harness.silent_reflection import SilentReflection


@pytest.fixture(scope="module")
def servers():
    shelves = ShelvesServer(descriptor_set(scratch_dir("grpc-wasm-shelves-")), reflection=True)
    started = {
        "routeguide_v1": Server("routeguide-server", "--reflection", "v1"),
        "greeter_v1alpha": Server("greeter-server", "--reflection", "v1alpha"),
        "library_both": Server("library-server", "--reflection", "both"),
        "greeter": Server("greeter-server"),
        "silent": SilentReflection(),
    }
    env = {name: s.addr for name, s in started.items()}
    env.update(shelves=f"127.0.0.1:{shelves.port}", dead="127.0.0.1:1", protos=PROTOS)
    yield env
    for s in started.values():
        s.stop()
    shelves.stop()


@pytest.fixture(scope="module", params=["cosocket", "runtime", "resty_ffi"])
def nginx(servers, request, tmp_path_factory):
    """Both transports of the FFI path, and the lua-resty-ffi path."""
    if request.param == "resty_ffi":
        out = tmp_path_factory.mktemp("harness")
        subprocess.run(["sh", os.path.join(os.path.dirname(__file__), "..", "resty-ffi", "build.sh"), str(out)],
                       check=True)
        env = dict(servers, resty_ffi_harness=str(out / "libresty_ffi_harness.so"))
        proxy = Nginx(env, workers=1, http_extra='init_by_lua_block { require("fake_resty_ffi") }',
                      mode="resty_ffi")
    else:
        proxy = Nginx(servers, workers=1, transport=request.param)
    yield proxy
    proxy.stop()
    check_log(proxy)


def test_reflect_then_call_every_kind_with_no_proto_file(nginx):
    status, body = nginx.get("/t/reflect")
    assert status == 200, body + nginx.log()[-3000:]
    lines = body.splitlines()
    assert lines[0] == ("before: false | UNIMPLEMENTED (12): unknown method "
                        "'/routeguide.RouteGuide/GetFeature' | 12"), body
    assert lines[1] == "v1: true routeguide.RouteGuide", body
    assert lines[2] == "unary: 12 Orchard Lane, Chester, NJ 07930, USA", body
    assert lines[3] == "server streaming: 35", body
    assert lines[4] == "bidi: one", body
    assert lines[5] == "again: true routeguide.RouteGuide", body
    assert lines[6] == "v1alpha: true helloworld.Greeter", body
    assert lines[7] == "greeter: Hello reflection!", body
    assert lines[8] == "grpcio: true shelves.Bookstore", body
    assert json.loads(lines[9].removeprefix("grpcio call: ")) == {"id": "7", "theme": "theme 7"}, body
    assert lines[10] == "services: helloworld.Greeter(1),routeguide.RouteGuide(4),shelves.Bookstore(29)", body
    assert lines[11] == "describe: bidi_streaming routeguide.RouteNote routeguide.RouteNote", body
    assert lines[12] == "describe unknown: false | 'routeguide.Nope' is not loaded", body
    assert lines[13] == ("no reflection: false | UNIMPLEMENTED (12): the server has no reflection service "
                         "(grpc.reflection.v1 and v1alpha are UNIMPLEMENTED) | 12"), body
    # tonic ends the stream for a symbol it does not know.
    assert lines[14] == ("unknown service: false | NOT_FOUND (5): the reflection stream ended (NOT_FOUND: "
                         "symbol 'routeguide.Nope' not found) before service 'routeguide.Nope' was answered | 5"), body
    assert lines[15] == "down: false | UNAVAILABLE | 14", body
    assert lines[16] == ("deadline: false | DEADLINE_EXCEEDED (4): deadline of 500 ms exceeded while loading "
                         "through reflection | 4"), body
    assert lines[17] == "deadline in time: true", body
    assert lines[18] == "services not a list: false | services must be a non-empty list of names, got string | -"
    assert lines[19] == "services empty: false | services must be a non-empty list of names, got table | -"
    assert lines[20] == "bad timeout: false | timeout must be a positive number of milliseconds, got number -1 | -"
    assert lines[21] == "opts not a table: false | reflect options must be a table, got string | -"
    assert lines[22] == "after: 12 Orchard Lane, Chester, NJ 07930, USA", body


def grpcurl(*args):
    """grpcurl's output (its reflection client speaks v1alpha)."""
    out = subprocess.run(["grpcurl", "-plaintext", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def learned(nginx, addr, names=(), call=None, request=None):
    query = {"addr": addr, "names": ",".join(names)}
    if call:
        query.update(call=call, request=json.dumps(request))
    status, body = nginx.get("/t/reflect_describe?" + urllib.parse.urlencode(query))
    assert status == 200, body + nginx.log()[-3000:]
    return json.loads(body)


RPC = re.compile(r"rpc (\w+) \( (stream )?\.([\w.]+) \) returns \( (stream )?\.([\w.]+) \)")
KINDS = {(False, False): "unary", (False, True): "server_streaming",
         (True, False): "client_streaming", (True, True): "bidi_streaming"}


def their_fields(text):
    """The (name, number) of the fields of the message grpcurl describes,
    its oneofs' included, its nested messages' not."""
    fields, blocks = [], []
    for line in text.splitlines()[2:]:
        stripped = line.strip()
        if stripped.endswith("{"):
            blocks.append(stripped.split()[0])
            continue
        if stripped == "}":
            if blocks:
                blocks.pop()
            continue
        m = re.match(r"(?:repeated |optional )?(?:map<[^>]+>|[\w.]+) (\w+) = (\d+)", stripped)
        if m and all(b == "oneof" for b in blocks):
            fields.append((m.group(1), int(m.group(2))))
    return sorted(fields)


@pytest.mark.parametrize("server", ["library_both", "shelves"])
def test_what_is_listed_and_described_equals_grpcurl_list_and_describe(nginx, servers, server):
    """grpcurl as the peer, for tonic's reflection and grpcio's: the same
    services, the same methods with the same streaming kinds and types,
    and the same fields of each message a method takes or gives."""
    addr = servers[server]
    theirs = [s for s in grpcurl(addr, "list").split() if not s.startswith("grpc.reflection.")]
    methods = {s: grpcurl(addr, "list", s).split() for s in theirs}
    # Each service described whole: grpcio's reflection finds no method by
    # its own name.
    described = {f"{s}.{d.group(1)}": d for s in theirs for d in RPC.finditer(grpcurl(addr, "describe", s))}
    assert sorted(described) == sorted(m for ms in methods.values() for m in ms)
    types = sorted({t for d in described.values() for t in (d.group(3), d.group(5))})
    ours = learned(nginx, addr, names=list(described) + types)
    assert sorted(ours["reflected"]) == sorted(theirs)
    listed = {s["name"]: s for s in ours["services"]}
    for service in theirs:
        assert sorted(f"{service}.{m['name']}" for m in listed[service]["methods"]) == sorted(methods[service])
    for method, d in described.items():
        mine = ours["described"][method]
        assert mine["kind"] == "method", method
        assert (mine["name"], mine["input"], mine["output"]) == (d.group(1), d.group(3), d.group(5)), method
        assert mine["streaming"] == KINDS[(bool(d.group(2)), bool(d.group(4)))], method
    assert len(types) >= 5
    for name in types:
        mine = ours["described"][name]
        assert mine["kind"] == "message", name
        theirs_fields = their_fields(grpcurl(addr, "describe", name))
        assert sorted((f["name"], f["number"]) for f in mine["fields"]) == theirs_fields, name


@pytest.mark.parametrize(("method", "request_json"), [
    ("GetShelf", {"shelf": "1"}),
    ("GetBook", {"name": "shelves/1/books/2"}),
    ("ListBooks", {"shelf": "1", "page": {"size": 2}}),
    ("SearchBooks", {"query": "a"}),
    ("GetShelf", {"shelf": "0"}),
])
def test_calls_answer_as_grpcurl_s_from_reflection_alone(nginx, servers, method, request_json):
    """The same call from the same reflected descriptors, by grpcurl and
    by Lua: the answers are equal as JSON values, and so are failures' codes."""
    addr = servers["library_both"]
    path = f"example.library.v1.Library/{method}"
    ours = learned(nginx, addr, call="/" + path, request=request_json)["answer"]
    out = subprocess.run(["grpcurl", "-plaintext", "-d", json.dumps(request_json), addr, path],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        code = re.search(r"Code: (\w+)", out.stderr)
        assert code, out.stderr
        assert GO_CODE_NAMES[ours["code"]] == code.group(1), (ours, out.stderr)
        return
    assert ours == json.loads(out.stdout)


# grpcurl's code names (Go's) for the codes these calls end with.
GO_CODE_NAMES = {5: "NotFound", 3: "InvalidArgument"}


def test_the_documented_example_runs(servers, tmp_path):
    """docs/openresty.md's reflection example, as it is written, against a
    routeguide server with reflection."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "openresty.md")) as f:
        readme = f.read()
    at = readme.index("<!-- run by host-tests/nginx/test_reflection.py -->")
    block = re.search(r"```lua\n(.*?)```", readme[at:], re.S).group(1)
    assert '"127.0.0.1:10000"' in block
    (tmp_path / "readme.lua").write_text(block.replace("127.0.0.1:10000", servers["routeguide_v1"]))
    proxy = Nginx(servers, workers=1, lua=str(tmp_path))
    try:
        for _ in range(2):
            assert proxy.get("/t/readme") == (200, "12 Orchard Lane, Chester, NJ 07930, USA\n"
                                                   "routeguide.RouteGuide 4 methods; RouteChat is bidi_streaming\n")
    finally:
        proxy.stop()
    check_log(proxy)


@pytest.mark.parametrize("stream_format", ["ndjson", "sse", "array"])
def test_grpc_openapi_documents_what_is_loaded(nginx, stream_format):
    """grpc.openapi: a valid OpenAPI 3.1 document (openapi-spec-validator)
    of the services asked for, with the stream format asked for."""
    status, body = nginx.get(f"/t/openapi?format={stream_format}")
    assert status == 200, body + nginx.log()[-3000:]
    document = json.loads(body)
    validate_spec(document)
    assert document["info"]["title"] == "Library"
    assert {tag for ops in document["paths"].values() for op in ops.values() for tag in op["tags"]} == \
        {"example.library.v1.Library"}
    stream = document["paths"]["/v1/shelves/{shelf}/books:stream"]["get"]["responses"]["200"]["content"]
    assert list(stream) == [{"ndjson": "application/x-ndjson", "sse": "text/event-stream",
                             "array": "application/json"}[stream_format]]


def test_grpc_openapi_refuses_bad_options(nginx):
    status, body = nginx.get("/t/openapi?bad=1")
    assert status == 200, body + nginx.log()[-3000:]
    assert body.splitlines() == [
        'bad format: false | openapi options: stream_format must be "ndjson", "sse" or "array"',
        "unknown: false | openapi options: unknown option 'pretty'; the options are title, stream_format, services",
        "not a table: false | openapi options must be a table, got string",
    ]

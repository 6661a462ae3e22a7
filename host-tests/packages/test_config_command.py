"""grpc-wasm-config, as make dist ships it: the configurations it writes run
as written, in Envoy and in nginx with ngx_wasm_module, and the examples in
examples/ are its output (so that they cannot drift from it)."""

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from openapi_spec_validator import validate as validate_spec

from harness.envoy import Server, envoy_binary, free_port, stop_process
from harness.ngx_wasm import nginx_binary
from harness.paths import ROOT

COMMAND = os.path.join(ROOT, "target", "dist", "grpc-wasm-config")
MODULE = os.path.join(ROOT, "target", "dist", "grpc_wasm.wasm")
PROTOS = os.path.join(ROOT, "protos")
EXAMPLES = os.path.join(ROOT, "examples")


def config_command(*args, cwd=None):
    return subprocess.run([COMMAND, *args], check=True, capture_output=True, text=True, cwd=cwd).stdout


def request(method, url, body=None, timeout=20):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(url, proc, log, timeout=30):
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(log()) from None
            time.sleep(0.1)


def run_envoy(yaml, port, admin, tmp_path):
    """Envoy on the configuration the command wrote, once it is ready."""
    (tmp_path / "envoy.yaml").write_text(yaml)
    log = tmp_path / "envoy.log"
    proc = subprocess.Popen([envoy_binary(), "-c", str(tmp_path / "envoy.yaml"), "--concurrency", "1",
                             "--disable-hot-restart", "--base-id", str(port), "--log-path", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{admin}/ready", proc, log.read_text)
    except BaseException:
        stop_process(proc)
        raise
    return proc


@pytest.fixture(scope="module")
def library():
    server = Server("library-server")
    yield server
    server.stop()


def test_the_plugin_configuration_takes_a_proto_and_its_imports(tmp_path):
    config = json.loads(config_command("--proto", os.path.join(PROTOS, "library.proto"), "-I", PROTOS))
    assert sorted(config["protos"]) == ["google/api/annotations.proto", "google/api/http.proto", "library.proto"]
    with open(os.path.join(PROTOS, "library.proto")) as f:
        assert config["protos"]["library.proto"] == f.read()
    # A file's own directory is searched too, and the files the module
    # bundles need no -I: the README's quick start has none.
    with open(os.path.join(PROTOS, "library.proto")) as f:
        (tmp_path / "library.proto").write_text(f.read())
    config = json.loads(config_command("--proto", str(tmp_path / "library.proto")))
    assert sorted(config["protos"]) == ["library.proto"]


def refusal(*args, cwd=None):
    out = subprocess.run([COMMAND, *args], capture_output=True, text=True, cwd=cwd)
    assert out.returncode != 0, out
    assert not out.stdout, out
    return out.stderr.strip()


def test_a_missing_file_is_named_as_what_it_is(tmp_path):
    assert refusal("--proto", str(tmp_path / "helloword.proto")) == \
        f"grpc-wasm-config: --proto {tmp_path}/helloword.proto: no such file"
    (tmp_path / "a.proto").write_text('syntax = "proto3";\nimport "b/missing.proto";\n')
    assert refusal("--proto", "a.proto", "-I", ".", cwd=tmp_path) == \
        "grpc-wasm-config: b/missing.proto, imported by a.proto, not found in . (add -I DIR)"


@pytest.mark.parametrize("name", ["../secret/credentials", "/proc/self/environ", "a/../../secret.proto",
                                  "C:/secret.proto", "./a.proto", "protos//a.proto"])
def test_imports_stay_inside_the_include_directories(tmp_path, name):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "credentials").write_text("TOKEN=hunter2\n")
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "a.proto").write_text(f'syntax = "proto3";\nimport "{name}";\n')
    assert refusal("--proto", "protos/a.proto", "-I", "protos", cwd=tmp_path) == (
        f"grpc-wasm-config: a.proto imports '{name}': an import names a file under an -I directory, "
        "never an absolute path, one with '..' or '.', or one with '//'")


def test_imports_are_read_as_protoc_reads_them(tmp_path):
    """Statements, not lines: an import after another statement on its
    line, two on one line, one with a comment inside, are all followed
    (before, only y.proto was, and the proxy could not load the rest); an
    import inside a comment is none (before, it was read)."""
    for name in ("x", "y", "z", "w", "v", "u"):
        (tmp_path / f"{name}.proto").write_text(f'syntax = "proto3";\nmessage {name.upper()} {{}}\n')
    (tmp_path / "a.proto").write_text(
        'syntax = "proto3"; import "x.proto";\n'
        'import "y.proto"; import "z.proto";\n'
        'import /* why */ "w.proto";\n'
        'import "v" ".proto";\n'
        'import "u\\x2eproto";\n'
        '/* import "missing.proto"; */\n'
        '// import "missing-too.proto";\n'
        'message A { string s = 1; }  // "import \'nope.proto\';"\n')
    config = json.loads(config_command("--proto", "a.proto", "-I", ".", cwd=tmp_path))
    assert sorted(config["protos"]) == ["a.proto", "u.proto", "v.proto", "w.proto", "x.proto", "y.proto", "z.proto"]


def test_a_proto_shadowed_by_an_earlier_include_is_refused(tmp_path):
    """protoc refuses it; before, the other file went in, under the
    given one's name, and the command said nothing."""
    for directory, package in (("third", "evil"), ("mine", "mine")):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "service.proto").write_text(f'syntax = "proto3";\npackage {package};\n')
    assert refusal("--proto", "mine/service.proto", "-I", "third", "-I", "mine", cwd=tmp_path) == (
        "grpc-wasm-config: --proto mine/service.proto is shadowed by third/service.proto (both are "
        "'service.proto' under -I): give that file, or put the directory of yours first")


def test_what_the_command_reads_is_bounded_and_checked(tmp_path):
    """No more .proto text than a configuration document may hold, read no
    further than that (a sparse 3 GB file once ran out of memory), and a
    clear refusal for a file that is not UTF-8 (before, a traceback)."""
    with open(tmp_path / "huge.proto", "wb") as f:
        f.truncate(3 << 30)
    (tmp_path / "a.proto").write_text('syntax = "proto3";\nimport "huge.proto";\n')
    assert refusal("--proto", "a.proto", "-I", ".", cwd=tmp_path) == (
        "grpc-wasm-config: ./huge.proto: the .proto files come to more than 16777216 bytes, "
        "the most a configuration document may be")
    # Within the text's bound, past the document's once escaped.
    (tmp_path / "q.proto").write_text('syntax = "proto3";\n// ' + '"' * (9 << 20) + "\n")
    refused = refusal("--proto", "q.proto", "-I", ".", cwd=tmp_path)
    assert refused.startswith("grpc-wasm-config: the configuration would be 188"), refused
    assert refused.endswith(" bytes, more than 16777216, the most a configuration document may be"), refused
    (tmp_path / "b.proto").write_bytes(b'syntax = "proto3";\n// caf\xe9\n')
    assert refusal("--proto", "b.proto", "-I", ".", cwd=tmp_path) == \
        "grpc-wasm-config: ./b.proto: not UTF-8 (byte 25), as a .proto must be"


@pytest.mark.parametrize(("option", "value"), [
    ("--address", "127.0.0.1 ;\n        location /leak { alias /etc/; autoindex on; }\n        listen 127.0.0.2"),
    ("--document-path", "/srv/x.json\nworker_processes 64;\nenv SECRET;\n#"),
    ("--module", "/a/b.wasm\n}"),
])
def test_no_argument_writes_a_line_of_its_own(tmp_path, option, value):
    """Before, --address went raw into nginx.conf (a location serving /etc
    passed nginx -t) and --document-path's name into a comment."""
    out = subprocess.run([COMMAND, "--proto", os.path.join(PROTOS, "helloworld.proto"), "--format", "nginx",
                          "--out-dir", str(tmp_path), option, value], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert f"error: argument {option}: {value!r}: " in out.stderr, out.stderr
    assert not (tmp_path / "nginx.conf").exists()


@pytest.mark.parametrize("path", ["openapi.json", "/a?b", "/a#b"])
def test_an_openapi_path_that_is_no_path_is_refused(path):
    out = subprocess.run([COMMAND, "--proto", os.path.join(PROTOS, "helloworld.proto"), "--openapi", path],
                         capture_output=True, text=True)
    assert out.returncode == 2, out
    assert f"error: argument --openapi: a path such as /openapi.json, not {path!r}" in out.stderr, out.stderr


def test_a_symbolic_link_out_of_the_include_directory_is_refused(tmp_path):
    (tmp_path / "secret").write_text("TOKEN=hunter2\n")
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "x.proto").symlink_to(tmp_path / "secret")
    (tmp_path / "protos" / "a.proto").write_text('syntax = "proto3";\nimport "x.proto";\n')
    assert refusal("--proto", "protos/a.proto", "-I", "protos", cwd=tmp_path) == (
        "grpc-wasm-config: protos/x.proto leads out of protos (a symbolic link): "
        "an import names a file under an -I directory")


def test_the_bundled_files_are_the_modules():
    with open(os.path.join(ROOT, "wasm-filter", "src", "descriptors.rs")) as f:
        bundled = re.search(r"const BUNDLED: .*?\n\];", f.read(), re.S).group(0)
    with open(COMMAND) as f:
        listed = re.search(r"^BUNDLED = \((.*?)\)", f.read(), re.S | re.M).group(1)
    assert sorted(re.findall(r'"(google/[^"]+)"', listed)) == sorted(re.findall(r'"(google/[^"]+)",', bundled))


def test_envoy_runs_the_envoy_yaml_it_writes(library, tmp_path):
    port, admin = free_port(), free_port()
    yaml = config_command("--proto", os.path.join(PROTOS, "library.proto"), "-I", PROTOS, "--format", "envoy",
                          "--upstream", library.addr, "--listen", str(port), "--address", "127.0.0.1",
                          "--admin-port", str(admin), "--module", MODULE, "--openapi", "/openapi.json")
    proc = run_envoy(yaml, port, admin, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        assert request("GET", f"{base}/v1/shelves/7") == (200, {"id": "7", "theme": "theme-7"})
        status, document = request("GET", f"{base}/openapi.json")
        assert status == 200
        validate_spec(document)
        assert "/v1/shelves/{shelf}" in document["paths"]
        assert request("POST", f"{base}/v1/shelves", {"id": 3, "theme": "poetry"}) == (
            200, {"id": "3", "theme": "poetry"})
        status, body = request("GET", f"{base}/v1/shelves/0")
        assert (status, body["message"]) == (404, "no shelf 0")
        # The filter hands its counters to Envoy at each tick (50 ms).
        handled = ('grpc_client_handled_total{grpc_service="example.library.v1.Library",'
                   'grpc_method="GetShelf",grpc_code="OK"} 1\n')
        deadline = time.time() + 10
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats/prometheus") as r:
                text = r.read().decode()
            if handled in text or time.time() > deadline:
                break
            time.sleep(0.1)
        assert handled in text, text
    finally:
        stop_process(proc)


def test_a_transcoding_envoy_yaml_sends_the_filters_own_calls_back_through_its_chain():
    """The internal listener has the ingress's routes and filters (YAML
    aliases of them), so a filter added after grpc-wasm in the ingress
    applies to requests without a body too; callout mode has none."""
    yaml = config_command("--proto", os.path.join(PROTOS, "helloworld.proto"), "--format", "envoy")
    assert '"loopback_cluster": "grpc_wasm_loopback"' in yaml
    assert "route_config: &routes" in yaml
    assert "http_filters: &filters" in yaml
    inner = yaml[yaml.index("  - name: grpc_wasm_loopback\n    # An internal listener"):]
    for line in ("internal_listener: {}", "route_config: *routes", "http_filters: *filters"):
        assert line in inner
    assert "server_listener_name: grpc_wasm_loopback" in inner
    assert "envoy.bootstrap.internal_listener" in yaml
    callout = config_command("--proto", os.path.join(PROTOS, "helloworld.proto"), "--format", "envoy", "--callout")
    assert "loopback" not in callout
    assert "internal_listener" not in callout
    assert "loopback" not in config_command("--proto", os.path.join(PROTOS, "helloworld.proto"))


@pytest.fixture(scope="module")
def greeter():
    server = Server("greeter-server")
    yield server
    server.stop()


def raw_request(url, body, headers, method="POST"):
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def test_envoy_runs_the_browser_gateway_it_writes(greeter, tmp_path):
    """--format envoy-web: a page of the given origin may call gRPC-Web and
    Connect through it (the preflight allows their headers and the
    metadata named), and the calls reach the server."""
    port, admin = free_port(), free_port()
    origin = "https://app.example.com"
    yaml = config_command("--format", "envoy-web", "--origin", origin, "--metadata", "x-who", "--upstream",
                          greeter.addr, "--listen", str(port), "--address", "127.0.0.1", "--admin-port", str(admin))
    proc = run_envoy(yaml, port, admin, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/helloworld.Greeter/SayHello"
        status, _, headers = raw_request(url, None, {
            "origin": origin, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,x-grpc-web,x-who"}, method="OPTIONS")
        assert status == 200
        assert headers["access-control-allow-origin"] == origin
        assert "x-who" in headers["access-control-allow-headers"].split(","), dict(headers)
        # Another origin is not allowed.
        _, _, other = raw_request(url, None, {"origin": "https://evil.example.com",
                                              "access-control-request-method": "POST"}, method="OPTIONS")
        assert "access-control-allow-origin" not in other
        # gRPC-Web: HelloRequest{name: "web"} in a frame; the answer's data
        # frame, then its trailers frame.
        hello = b"\x0a\x03web"
        frame = b"\x00" + len(hello).to_bytes(4, "big") + hello
        status, body, headers = raw_request(url, frame, {"content-type": "application/grpc-web+proto",
                                                         "x-grpc-web": "1", "origin": origin})
        assert (status, headers["access-control-expose-headers"]) == (200, "grpc-status,grpc-message,"
                                                                           "grpc-status-details-bin,x-who")
        reply = b"\x0a\x0aHello web!"
        assert body.startswith(b"\x00" + len(reply).to_bytes(4, "big") + reply), body
        assert b"grpc-status:0" in body[5 + len(reply):], body
        # Connect, unary with a protobuf body: the bare message back.
        status, body, _ = raw_request(url, hello, {"content-type": "application/proto",
                                                   "connect-protocol-version": "1", "origin": origin})
        assert (status, body) == (200, reply)
    finally:
        stop_process(proc)


def test_the_browser_gateway_is_refused_what_it_cannot_use():
    assert "give the --origin" in refusal("--format", "envoy-web")
    assert "takes no .proto" in refusal("--format", "envoy-web", "--origin", "https://a.example",
                                        "--proto", "x.proto")
    assert "a metadata key is letters" in refusal("--format", "envoy-web", "--origin", "https://a.example",
                                                  "--metadata", "x who")
    assert "are for --format envoy-web" in refusal("--proto", "x.proto", "--origin", "https://a.example")
    # Nothing given can end a line of the file and start YAML of its own.
    assert "give an origin" in refusal("--format", "envoy-web", "--origin", "https://a.example\nadmin: {}")
    assert "give host:port" in refusal("--format", "envoy-web", "--origin", "https://a.example",
                                       "--upstream", "x\nadmin: {}:1")


def test_ngx_wasm_module_runs_the_nginx_conf_it_writes(library, tmp_path):
    nginx = nginx_binary()
    port, config_port = free_port(), free_port()
    out = tmp_path / "conf"
    config_command("--proto", os.path.join(PROTOS, "library.proto"), "-I", PROTOS, "--format", "nginx",
                   "--upstream", library.addr, "--listen", str(port), "--address", "127.0.0.1",
                   "--config-port", str(config_port), "--module", MODULE, "--out-dir", str(out))
    (tmp_path / "logs").mkdir()
    proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(out / "nginx.conf"),
                             "-g", "daemon off; user root;"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    log = tmp_path / "logs" / "error.log"
    try:
        wait_for(f"http://127.0.0.1:{config_port}/grpc-wasm.json", proc, log.read_text)
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 10
        # The filter answers 503 until it has fetched its configuration.
        while (answer := request("GET", f"{base}/v1/shelves/7"))[0] == 503 and time.time() < deadline:
            time.sleep(0.1)
        assert answer == (200, {"id": "7", "theme": "theme-7"}), log.read_text()[-3000:]
        assert request("POST", f"{base}/v1/shelves", {"id": 3, "theme": "poetry"}) == (
            200, {"id": "3", "theme": "poetry"})
    finally:
        stop_process(proc)


@pytest.mark.parametrize("name", ["envoy/envoy.yaml", "ngx_wasm_module/nginx.conf"])
def test_the_examples_are_what_the_command_writes(name, tmp_path):
    with open(os.path.join(EXAMPLES, name)) as f:
        committed = f.read()
    _, command, shown = committed.split("\n", 2)
    args = command.removeprefix("# grpc-wasm-config ").split()
    if "DIR" in args:
        args[args.index("DIR")] = str(tmp_path)
        config_command(*args, cwd=ROOT)
        written = (tmp_path / "nginx.conf").read_text()
    else:
        written = config_command(*args, cwd=ROOT)
    assert written == shown, f"regenerate examples/{name}: its second line is the command"


def test_protos_are_named_as_protoc_names_them(tmp_path):
    """Files under a -I directory are named relative to it, as their
    imports name them (else a type would be defined twice); both quote
    styles of import are followed."""
    api = tmp_path / "api" / "v1"
    api.mkdir(parents=True)
    (api / "service.proto").write_text('syntax = "proto3";\npackage api.v1;\nimport \'api/v1/types.proto\';\n'
                                       "service S { rpc M (T) returns (T); }\n")
    (api / "types.proto").write_text('syntax = "proto3";\npackage api.v1;\nmessage T { string a = 1; }\n')
    config = json.loads(config_command("--proto", "api/v1/service.proto", "--proto", "api/v1/types.proto",
                                       "-I", ".", cwd=tmp_path))
    assert sorted(config["protos"]) == ["api/v1/service.proto", "api/v1/types.proto"]


def test_the_nginx_conf_takes_odd_paths_and_ipv6(tmp_path):
    """Paths with spaces and quotes are quoted, IPv6 addresses bracketed:
    nginx -t takes the file."""
    odd = tmp_path / 'a dir "quoted"'
    odd.mkdir()
    module = odd / "grpc wasm.wasm"
    with open(MODULE, "rb") as src:
        module.write_bytes(src.read())
    config_command("--proto", os.path.join(PROTOS, "helloworld.proto"), "--format", "nginx", "--out-dir", str(odd),
                   "--upstream", "[::1]:50051", "--address", "::", "--listen", str(free_port()),
                   "--config-port", str(free_port()), "--module", str(module))
    (tmp_path / "logs").mkdir()
    checked = subprocess.run([nginx_binary(), "-t", "-p", str(tmp_path), "-c", str(odd / "nginx.conf")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    with open(odd / "nginx.conf") as f:
        conf = f.read()
    assert "grpc_pass grpc://[::1]:50051;" in conf
    dollar = subprocess.run([COMMAND, "--proto", os.path.join(PROTOS, "helloworld.proto"), "--format", "nginx",
                             "--out-dir", str(tmp_path / "x"), "--module", "/a/$b.wasm"],
                            capture_output=True, text=True)
    assert dollar.returncode != 0
    assert "nginx would read the $ as a variable" in dollar.stderr


def test_envoy_runs_the_reflection_envoy_yaml_it_writes(tmp_path):
    """No .proto: the filter asks the server for its descriptors."""
    server = Server("library-server", "--reflection", "v1")
    port, admin = free_port(), free_port()
    yaml = config_command("--reflect", server.addr, "--format", "envoy", "--listen", str(port),
                          "--address", "127.0.0.1", "--admin-port", str(admin), "--module", MODULE)
    assert "--upstream" not in yaml
    assert '"reflection"' in yaml
    proc = run_envoy(yaml, port, admin, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/v1/shelves/7"
        deadline = time.time() + 15
        while request("GET", url)[0] == 503 and time.time() < deadline:
            time.sleep(0.1)
        assert request("GET", url) == (200, {"id": "7", "theme": "theme-7"})
    finally:
        stop_process(proc)
        server.stop()


def test_reflection_is_refused_where_the_filter_cannot_ask():
    assert "ngx_wasm_module has no gRPC calls" in refusal("--reflect", "--format", "nginx", "--out-dir", "x")
    assert "give it or --upstream, not both" in refusal("--reflect", "127.0.0.1:1", "--upstream", "127.0.0.1:2")

"""The packages `make dist` writes (target/dist), each installed the way a
user installs it, with no path into this repository: the OCI image through
skopeo and umoci and its plugin.wasm in Envoy; the LuaRocks rock into an
empty tree, the release archive unpacked, and `make install PREFIX`, each
then called from nginx; the npm package installed by npm and run by Node;
Kong's metadata against good and bad configurations; the checksums."""

import base64
import hashlib
import json
import os
import re
import subprocess
import tarfile
import time
import urllib.error
import urllib.request

import pytest

from harness.config_schema import META, errors
from harness.envoy import Envoy, Server, free_port, read_protos, scratch_dir
from harness.paths import ROOT

DIST = os.path.join(ROOT, "target", "dist")
PROTOS = os.path.join(ROOT, "protos")


def workspace_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        return re.search(r'\[workspace\.package\][^\[]*?\nversion = "([^"]+)"', f.read()).group(1)


VERSION = workspace_version()
ARCH = os.uname().machine


def dist(*name):
    return os.path.join(DIST, *name)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def elf_section_names(path):
    """The section names of a 64-bit little-endian ELF file (what `file`
    reads to say "stripped": no .symtab), without needing `file`."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x7fELF\x02\x01", "a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    names_at = section(shstrndx)[4]
    return {data[names_at + section(i)[0]:].split(b"\0", 1)[0].decode() for i in range(shnum)}


@pytest.fixture(scope="module")
def greeter():
    server = Server("greeter-server")
    yield server
    server.stop()


# What grpc_wasm.wasm may weigh: a little over its size, so that growth is
# a decision (the commit that raises it says why) and not a drift. The goal
# is 1 MiB; docs/benchmarks.md says what stands in the way.
MODULE_BUDGET_BYTES = 1_766_700


def test_the_module_stays_within_its_size_budget():
    size = os.path.getsize(dist("grpc_wasm.wasm"))
    assert size <= MODULE_BUDGET_BYTES, (
        f"grpc_wasm.wasm is {size:,} B, over its budget of {MODULE_BUDGET_BYTES:,} B: "
        "find what grew with `twiggy top` on the module before wasm-opt "
        "(target/wasm32-wasip1/wasm/grpc_wasm.wasm), or raise the budget in a commit that says why")


# grpc_wasm_lite.wasm, the filter without the .proto compiler, held the
# same way.
LITE_MODULE_BUDGET_BYTES = 1_428_700


def test_the_lite_module_transcodes_with_a_descriptor_set_within_its_budget(greeter, tmp_path):
    size = os.path.getsize(dist("grpc_wasm_lite.wasm"))
    assert size <= LITE_MODULE_BUDGET_BYTES, (
        f"grpc_wasm_lite.wasm is {size:,} B, over its budget of {LITE_MODULE_BUDGET_BYTES:,} B: find what grew "
        "with `twiggy top`, or raise the budget in a commit that says why")
    assert size < os.path.getsize(dist("grpc_wasm.wasm")) - 100_000, "the lite module still links the compiler"
    from harness.envoy import wasm_filter
    from harness.throughput import descriptor_set
    with open(descriptor_set(str(tmp_path)), "rb") as f:
        config = {"descriptor_set": base64.b64encode(f.read()).decode()}
    proxy = Envoy(config, [("/", "greeter", greeter.port)],
                  http_filters=[wasm_filter(config, module=dist("grpc_wasm_lite.wasm"))])
    try:
        status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "lite"})
        assert (status, body) == (200, {"message": "Hello lite!"}), proxy.log()
    finally:
        proxy.stop()
    # "protos" is refused, naming what to give instead: Envoy does not start.
    config = {"protos": read_protos("helloworld.proto")}
    with pytest.raises(Exception, match=r"protos: this module is built without the \.proto compiler "
                                        r"\(grpc_wasm_lite\.wasm\): give \"descriptor_set\""):
        Envoy(config, [("/", "greeter", greeter.port)],
              http_filters=[wasm_filter(config, module=dist("grpc_wasm_lite.wasm"))])


def test_the_lite_module_takes_its_descriptors_through_reflection(tmp_path):
    from harness.envoy import wasm_filter
    server = Server("greeter-server", "--reflection", "v1")
    config = {"reflection": {"upstream": "greeter"}}
    proxy = Envoy(config, [("/", "greeter", server.port)],
                  http_filters=[wasm_filter(config, module=dist("grpc_wasm_lite.wasm"))])
    try:
        deadline = time.time() + 15
        while proxy.post("/helloworld.Greeter/SayHello", {"name": "lite"})[0] == 503 and time.time() < deadline:
            time.sleep(0.05)
        status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "lite"})
        assert (status, body) == (200, {"message": "Hello lite!"}), proxy.log()
    finally:
        proxy.stop()
        server.stop()


# The npm package's two builds, held the same way (make npm writes them).
# Raised 6 KB for the public-import guard every descriptor set passes.
NPM_WASM_BUDGET_BYTES = {"full": 1_109_600, "lite": 873_400}


@pytest.mark.parametrize("build", sorted(NPM_WASM_BUDGET_BYTES))
def test_the_npm_wasm_files_stay_within_their_size_budgets(build):
    path = os.path.join(ROOT, "js", "npm", "wasm", build, "grpc_wasm_bg.wasm")
    size = os.path.getsize(path)
    budget = NPM_WASM_BUDGET_BYTES[build]
    assert size <= budget, (
        f"the npm package's {build} wasm is {size:,} B, over its budget of {budget:,} B: find what grew with "
        "`twiggy top`, or raise the budget in a commit that says why")


def test_every_package_is_there_with_its_checksum():
    names = {"grpc_wasm.wasm", "grpc_wasm_lite.wasm", "grpc_wasm.meta.json", "grpc-wasm-config",
             f"grpc-wasm-openresty-{VERSION}-linux-{ARCH}.tar.gz", f"grpc-wasm-{VERSION}-1.rockspec",
             f"grpc-wasm-{VERSION}-1.linux-{ARCH}.rock", f"grpc-wasm-{VERSION}.tgz"}
    with open(dist("SHA256SUMS")) as f:
        sums = dict(reversed(line.split()) for line in f)
    assert set(sums) == names
    for name, digest in sums.items():
        assert sha256(dist(name)) == digest, name
    for module in ("grpc_wasm.wasm", "grpc_wasm_lite.wasm"):
        with open(dist(f"{module}.sha256")) as f:
            assert f.read() == f"{sums[module]}  {module}\n"
    # The module is the one the tests ran, and says the workspace's version.
    assert sha256(dist("grpc_wasm.wasm")) == sha256(os.path.join(ROOT, "target", "grpc_wasm.wasm"))


def test_the_oci_image_is_a_compat_wasm_image_that_envoy_runs(greeter, tmp_path):
    image = f"oci:{dist('oci')}:{VERSION}"
    manifest = json.loads(run("skopeo", "inspect", "--raw", image).stdout)
    assert manifest["annotations"]["module.wasm.image/variant"] == "compat"
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]
    info = json.loads(run("skopeo", "inspect", image).stdout)
    assert info["Labels"]["org.opencontainers.image.version"] == VERSION
    # A copy as a registry would get it, then unpacked as a runtime would.
    run("skopeo", "copy", "--quiet", image, f"oci:{tmp_path / 'copied'}:{VERSION}")
    run("umoci", "unpack", "--rootless", "--image", f"{tmp_path / 'copied'}:{VERSION}", str(tmp_path / "bundle"))
    plugin = tmp_path / "bundle" / "rootfs" / "plugin.wasm"
    assert sorted(os.listdir(plugin.parent)) == ["plugin.wasm"]
    assert sha256(plugin) == sha256(dist("grpc_wasm.wasm"))
    from harness.envoy import wasm_filter
    config = {"protos": read_protos("helloworld.proto")}
    proxy = Envoy(config, [("/", "greeter", greeter.port)], http_filters=[wasm_filter(config, module=str(plugin))])
    try:
        status, body, _ = proxy.post("/helloworld.Greeter/SayHello", {"name": "oci"})
        assert (status, body) == (200, {"message": "Hello oci!"}), proxy.log()
    finally:
        proxy.stop()


def test_the_same_inputs_make_the_same_image(tmp_path):
    script = os.path.join(ROOT, "scripts", "dist", "oci_image.py")
    for out in ("a", "b"):
        run("python3", script, dist("grpc_wasm.wasm"), str(tmp_path / out), VERSION)
    with open(tmp_path / "a" / "index.json") as a, open(tmp_path / "b" / "index.json") as b:
        assert a.read() == b.read()
    with open(dist("oci", "index.json")) as shipped, open(tmp_path / "a" / "index.json") as again:
        assert shipped.read() == again.read()


BAD_CONFIGS = [
    ({"protos": {"a.proto": 1}}, "protos/a.proto: 1 is not of type 'string'"),
    ({"prtos": {}}, "(top): Additional properties are not allowed ('prtos' was unexpected)"),
    ({"stream_format": "xml"}, "stream_format: 'xml' is not one of ['ndjson', 'sse', 'array']"),
    ({"max_response_bytes": 1 << 30}, "max_response_bytes: 1073741824 is greater than the maximum of 268435456"),
    ({"callout": {"upstream": "a", "timeout_ms": 0}}, "callout/timeout_ms: 0 is less than the minimum of 1"),
    ({"callout": {"upstream": "a", "propagate": ["a b"]}},
     "callout/propagate/0: 'a b' does not match '^[A-Za-z0-9_.-]+$'"),
    ({"fetch": {"upstream": "files"}}, "fetch: 'path' is a required property"),
    ({"print_options": {"emit_default": True}},
     "print_options: Additional properties are not allowed ('emit_default' was unexpected)"),
]


@pytest.mark.parametrize(("config", "error"), BAD_CONFIGS)
def test_kongs_schema_refuses_what_the_filter_refuses(config, error):
    assert errors(config) == [error]


def test_kongs_metadata_is_the_shipped_file_and_its_label_patterns_label_envoy():
    with open(dist("grpc_wasm.meta.json")) as f:
        assert json.load(f) == META
    labels = [p["label"] for p in META["metrics"]["label_patterns"]]
    assert labels == ["grpc_service", "grpc_method", "grpc_code", "cause"]
    name = "grpc_client_handled_total;grpc_service=a.B;grpc_method=C;grpc_code=OK"
    for p in META["metrics"]["label_patterns"][:3]:
        m = re.search(p["pattern"], name)
        name = name.replace(m.group(1), "")
    assert name == "grpc_client_handled_total"


NGINX_CONF = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off;
user root;
master_process on;
worker_processes 1;
error_log {prefix}/error.log info;
pid {prefix}/nginx.pid;
events {{}}
http {{
    access_log off;
    lua_package_path "{lua_path};/usr/share/lua/5.1/?.lua;;";
    lua_package_cpath "{lua_cpath};;";
    server {{
        listen 127.0.0.1:{port};
        location = /hello {{
            content_by_lua_block {{
                local grpc = require("resty.ffi.grpc")
                assert(grpc.loadfile("{protos}/helloworld.proto"))
                local ok, conn = grpc.connect("{addr}")
                local ok, res = conn:unary("/helloworld.Greeter/SayHello", {{ name = "nginx" }})
                ngx.say(grpc.version, " ", package.searchpath("resty.ffi.grpc", package.path), " ",
                        ok and res.message or res)
            }}
        }}
    }}
}}
"""


def call_through_nginx(lua_path, lua_cpath, addr):
    """The README's OpenResty example with the package found only through
    these paths (no GRPC_WASM_SHIM or _MODULE: the shim from the cpath,
    the module next to it); returns its answer."""
    prefix = scratch_dir("grpc-wasm-pkg-nginx-")
    port = free_port()
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(prefix=prefix, lua_path=lua_path, lua_cpath=lua_cpath, port=port,
                                  protos=PROTOS, addr=addr))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_WASM_")}
    proc = subprocess.Popen(["nginx", "-p", prefix, "-c", conf], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello", timeout=20) as r:
                    return r.read().decode()
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    with open(os.path.join(prefix, "error.log")) as log:
                        raise AssertionError(log.read()[-3000:]) from None
                time.sleep(0.1)
    finally:
        proc.send_signal(3)
        proc.wait(timeout=30)


def test_the_rock_installs_into_an_empty_tree_and_serves(greeter, tmp_path):
    tree = tmp_path / "tree"
    run("luarocks", "--lua-version", "5.1", "install", "--tree", str(tree), "--deps-mode", "none",
        dist(f"grpc-wasm-{VERSION}-1.linux-{ARCH}.rock"))
    lib, share = tree / "lib" / "lua" / "5.1", tree / "share" / "lua" / "5.1"
    assert sorted(os.listdir(lib)) == ["grpc_wasm.wasm", "liblua_shim.so"]
    answer = call_through_nginx(f"{share}/?.lua", f"{lib}/?.so", greeter.addr)
    assert answer == f"{VERSION} {share}/resty/ffi/grpc.lua Hello nginx!\n"


def test_the_release_archive_unpacked_serves(greeter, tmp_path):
    name = f"grpc-wasm-{VERSION}"
    with tarfile.open(dist(f"grpc-wasm-openresty-{VERSION}-linux-{ARCH}.tar.gz")) as tar:
        members = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
        # Whatever the umask of the machine that made it.
        assert all(m.mode & 0o022 == 0 for m in tar.getmembers())
        tar.extractall(tmp_path, filter="data")
    lua = [f"{name}/lua/resty/ffi/grpc.lua", *sorted(
        f"{name}/lua/resty/ffi/grpc/{f}" for f in os.listdir(os.path.join(ROOT, "lua-shim/lib/resty/ffi/grpc")))]
    assert members == sorted([f"{name}/INSTALL.md", f"{name}/LICENSE", f"{name}/grpc-wasm-{VERSION}-1.rockspec",
                              f"{name}/lib/grpc_wasm.wasm", f"{name}/lib/liblua_shim.so", *lua])
    root = tmp_path / name
    # Stripped (20.8 MB with its symbols).
    assert os.path.getsize(root / "lib" / "liblua_shim.so") < 18_000_000
    assert ".symtab" not in elf_section_names(root / "lib" / "liblua_shim.so")
    answer = call_through_nginx(f"{root}/lua/?.lua", f"{root}/lib/?.so", greeter.addr)
    assert answer == f"{VERSION} {root}/lua/resty/ffi/grpc.lua Hello nginx!\n"


def test_make_install_prefix_serves(greeter, tmp_path):
    run(os.path.join(ROOT, "scripts", "dist", "install.sh"), str(tmp_path))
    share, lib = tmp_path / "share" / "lua" / "5.1", tmp_path / "lib" / "lua" / "5.1"
    answer = call_through_nginx(f"{share}/?.lua", f"{lib}/?.so", greeter.addr)
    assert answer == f"{VERSION} {share}/resty/ffi/grpc.lua Hello nginx!\n"


def test_the_npm_package_installs_and_runs_in_node(tmp_path):
    (tmp_path / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    run("npm", "install", "--no-audit", "--no-fund", "--offline", dist(f"grpc-wasm-{VERSION}.tgz"), cwd=tmp_path)
    (tmp_path / "main.mjs").write_text("""
import { loadProto } from "grpc-wasm";
import { readFileSync } from "node:fs";
const schema = await loadProto({ "helloworld.proto": readFileSync(process.argv[2], "utf8") });
const bytes = schema.encode("helloworld.HelloRequest", { name: "npm" });
console.log(JSON.stringify(schema.decode("helloworld.HelloRequest", bytes)));
""")
    out = run("node", "main.mjs", os.path.join(PROTOS, "helloworld.proto"), cwd=tmp_path).stdout
    assert out == '{"name":"npm"}\n'
    with open(tmp_path / "node_modules" / "grpc-wasm" / "package.json") as f:
        assert json.load(f)["version"] == VERSION


def test_the_readmes_openresty_example_runs_as_shown(tmp_path):
    """examples/openresty/nginx.conf, with only its install prefix, port and
    server address changed, in Debian's nginx (the example is OpenResty's,
    whose nginx has the Lua module built in)."""
    greeter = Server("greeter-server")  # stopped midway: its own
    prefix = tmp_path / "usr"
    run(os.path.join(ROOT, "scripts", "dist", "install.sh"), str(prefix))
    protos = tmp_path / "protos"
    protos.mkdir()
    with open(os.path.join(PROTOS, "helloworld.proto")) as src:
        (protos / "helloworld.proto").write_text(src.read())
    port = free_port()
    with open(os.path.join(ROOT, "examples", "openresty", "nginx.conf")) as f:
        conf = f.read()
    conf = (conf.replace("/usr/local", str(prefix)).replace("/etc/grpc-wasm/protos", str(protos))
            .replace("listen 8080;", f"listen 127.0.0.1:{port};").replace("127.0.0.1:50051", greeter.addr))
    assert "/usr/local" not in conf
    (tmp_path / "nginx.conf").write_text(conf)
    (tmp_path / "logs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_WASM_")}
    modules = ("load_module /usr/lib/nginx/modules/ndk_http_module.so; "
               "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;")
    proc = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                             "-g", f"{modules} daemon off; user root;"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/hello?name=readme", timeout=20) as r:
                    assert r.read() == b"Hello readme!\n"
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise AssertionError((tmp_path / "logs" / "error.log").read_text()[-3000:]) from None
                time.sleep(0.1)
        handled = ('grpc_client_handled_total{grpc_service="helloworld.Greeter",grpc_method="SayHello",'
                   'grpc_code="OK"} 1\n')
        while True:
            with urllib.request.urlopen(f"{base}/metrics", timeout=20) as r:
                text = r.read().decode()
            if handled in text or time.time() > deadline:
                break
            time.sleep(0.2)
        assert handled in text, text
        greeter.stop()
        with pytest.raises(urllib.error.HTTPError) as down:
            urllib.request.urlopen(f"{base}/hello", timeout=20)
        assert down.value.code == 502
        assert down.value.read().decode().startswith("UNAVAILABLE (14): ")
    finally:
        greeter.stop()
        proc.send_signal(3)
        proc.wait(timeout=30)


def test_the_readmes_node_example_runs_as_shown(greeter, tmp_path):
    (tmp_path / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    run("npm", "install", "--no-audit", "--no-fund", "--offline", dist(f"grpc-wasm-{VERSION}.tgz"), cwd=tmp_path)
    with open(os.path.join(ROOT, "examples", "node", "hello.mjs")) as f:
        (tmp_path / "hello.mjs").write_text(f.read())
    proto = os.path.join(PROTOS, "helloworld.proto")
    out = run("node", "hello.mjs", proto, f"http://{greeter.addr}", cwd=tmp_path).stdout
    assert out == "Hello node!\n"
    down = run("node", "hello.mjs", proto, f"http://127.0.0.1:{free_port()}", cwd=tmp_path).stdout
    assert down.startswith("UNAVAILABLE: "), down

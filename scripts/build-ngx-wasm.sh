#!/usr/bin/env bash
# Builds nginx with Kong's ngx_wasm_module (the filter's second proxy-wasm
# host) from the unchanged sources in ../shared/third_party, on wasmtime's C
# API from crates.io, and caches the result outside the repo, keyed by the
# archives' checksums and this script, so later runs skip the ~15 minute
# build. Prints the path of the nginx binary on stdout.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
THIRD_PARTY="${GRPC_WASM_THIRD_PARTY:-$here/../../shared/third_party}"
NGINX_TGZ="$THIRD_PARTY/nginx-1.27.4.tar.gz"
MODULE_TGZ="$THIRD_PARTY/ngx_wasm_module-3bed278.tar.gz"
WASMTIME_VERSION="26.0.1"

for f in "$NGINX_TGZ" "$MODULE_TGZ"; do
  [[ -f "$f" ]] || { echo "missing $f (see ../shared/third_party/README.md)" >&2; exit 1; }
done
(cd "$THIRD_PARTY" && sha256sum --quiet -c SHA256SUMS >&2)

# Bump BUILD_REV when a change below changes what gets built.
BUILD_REV=1
key=$( (cat "$NGINX_TGZ" "$MODULE_TGZ"; echo "$WASMTIME_VERSION $BUILD_REV") | sha256sum | cut -c1-16)
CACHE="${GRPC_WASM_CACHE:-$HOME/.cache/grpc-wasm}/ngx-wasm-$key"
NGINX="$CACHE/sbin/nginx"

if [[ -x "$NGINX" ]]; then
  echo "$NGINX"
  exit 0
fi

need=()
for pkg in libpcre2-dev zlib1g-dev libssl-dev gcc make; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

# The build tree lives in the cache too, so an interrupted build resumes.
work="$CACHE.work"
mkdir -p "$work"

# 1. wasmtime's C API as a static library. crates.io ships it as the crate
#    wasmtime-c-api-impl; a one-line staticlib crate turns it into
#    libwasmtime.a, and its build script writes the headers to OUT_DIR.
capi="$work/wasmtime-capi"
mkdir -p "$capi/src"
cat >"$capi/Cargo.toml" <<TOML
[package]
name = "wasmtime"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
crate-type = ["staticlib"]
path = "src/lib.rs"

[dependencies]
wasmtime-c-api = { package = "wasmtime-c-api-impl", version = "=$WASMTIME_VERSION", default-features = false, features = ["cranelift", "wat", "wasi", "cache", "parallel-compilation", "profiling", "gc", "threads"] }

[profile.release]
debug = false
panic = "abort"

[workspace]
TOML
echo 'pub use wasmtime_c_api::*;' >"$capi/src/lib.rs"
(cd "$capi" && CARGO_TARGET_DIR="$capi/target" cargo build --release -q >&2)
lib="$capi/target/release/libwasmtime.a"
conf=$(find "$capi/target/release/build" -path '*/out/include/wasmtime/conf.h' | head -n 1)
[[ -f "$lib" && -n "$conf" ]] || { echo "wasmtime C API build left no library or headers" >&2; exit 1; }
include="${conf%/wasmtime/conf.h}"
# The generated conf.h leaves out WAT although the library has it, and
# ngx_wasm_module compiles its .wat support only when the macro is set.
# (The file has CRLF line ends.)
sed -i 's|^/\* #undef WASMTIME_FEATURE_WAT \*/\r\?$|#define WASMTIME_FEATURE_WAT|' "$conf"
grep -q '#define WASMTIME_FEATURE_WAT' "$conf" || { echo "could not patch $conf" >&2; exit 1; }

# 2. nginx with the module, configured as the module's own docs describe.
rm -rf "$work/src" && mkdir -p "$work/src"
tar -xzf "$NGINX_TGZ" -C "$work/src"
tar -xzf "$MODULE_TGZ" -C "$work/src"
nginx_src=$(find "$work/src" -maxdepth 1 -type d -name 'nginx-*' | head -n 1)
module_src=$(find "$work/src" -maxdepth 1 -type d -name 'ngx_wasm_module-*' | head -n 1)
(
  cd "$nginx_src"
  NGX_WASM_RUNTIME=wasmtime auto/configure \
    --prefix="$CACHE" \
    --with-http_v2_module \
    --with-http_ssl_module \
    --add-module="$module_src" \
    --with-cc-opt="-I$include -O2" \
    --with-ld-opt="-L$(dirname "$lib") -lwasmtime -lm -ldl -lpthread"
  make -j "$(nproc)"
  make install
) >&2

[[ -x "$NGINX" ]] || { echo "nginx was not installed at $NGINX" >&2; exit 1; }
rm -rf "$work"
echo "$NGINX"

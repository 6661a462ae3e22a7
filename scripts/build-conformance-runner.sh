#!/usr/bin/env bash
# Builds protobuf's conformance_test_runner from the sources vendored by the
# crates.io package protobuf-src, and caches the binary outside the repo,
# keyed by version, so later runs skip the ~13 minute build.
# Prints the path of the runner on stdout.
set -euo pipefail

VERSION="2.1.1+27.1"
CACHE="${GRPC_WASM_CACHE:-$HOME/.cache/grpc-wasm}/conformance-$VERSION"
RUNNER="$CACHE/conformance_test_runner"

if [[ -x "$RUNNER" ]]; then
  echo "$RUNNER"
  exit 0
fi

need=()
command -v cmake >/dev/null || need+=(cmake)
[[ -f /usr/include/jsoncpp/json/json.h ]] || need+=(libjsoncpp-dev)
command -v g++ >/dev/null || need+=(g++)
if ((${#need[@]})); then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

# Let cargo fetch the crate (it knows the registry); we only need its source.
# The build tree lives in the cache too, so an interrupted build resumes.
work="$CACHE/work"
mkdir -p "$work/fetch/src"
cat >"$work/fetch/Cargo.toml" <<TOML
[package]
name = "fetch-protobuf-src"
version = "0.0.0"
edition = "2021"
[dependencies]
protobuf-src = "=$VERSION"
TOML
touch "$work/fetch/src/lib.rs"
(cd "$work/fetch" && cargo fetch -q >&2)
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "protobuf-src-$VERSION" | head -n 1)
[[ -n "$src" ]] || { echo "protobuf-src $VERSION not found after cargo fetch" >&2; exit 1; }

cmake -S "$src/protobuf" -B "$work/build" \
  -DCMAKE_BUILD_TYPE=Release \
  -Dprotobuf_BUILD_CONFORMANCE=ON \
  -Dprotobuf_JSONCPP_PROVIDER=package \
  -Dprotobuf_BUILD_TESTS=OFF \
  -Dprotobuf_ABSL_PROVIDER=module \
  -DABSL_PROPAGATE_CXX_STD=ON \
  -DCMAKE_CXX_STANDARD=17 \
  -DCMAKE_CXX_FLAGS="-I/usr/include/jsoncpp" >&2
cmake --build "$work/build" --target conformance_test_runner -j "$(nproc)" >&2

mkdir -p "$CACHE"
cp "$work/build/conformance_test_runner" "$RUNNER.tmp"
mv "$RUNNER.tmp" "$RUNNER"
rm -rf "$work"
echo "$RUNNER"

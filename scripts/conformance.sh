#!/usr/bin/env bash
# Runs protobuf's conformance suite (binary and JSON; text format is skipped
# by the testee) against the core, with recommended tests enforced: once
# natively, once inside the .wasm the hosts run (make wasm builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

runner=$(scripts/build-conformance-runner.sh)
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name 'protobuf-src-2.1.1+27.1' | head -n 1)
[[ -n "$src" ]] || { echo "protobuf-src sources not found" >&2; exit 1; }
# The same build as `make build-tests`, so nothing is rebuilt after it.
cargo build -q --release --workspace --all-targets
testee="$PWD/target/release/conformance-testee"
wasm="$PWD/target/grpc_wasm.wasm"
[[ -f "$wasm" ]] || { echo "$wasm not found: run make wasm" >&2; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The runner needs a writable working directory for its failing-tests file.
cd "$scratch"

# suite ENGINE [VAR=VALUE...]: one run, its errors and summary; its status.
suite() {
  local engine=$1 out="$scratch/$1.out" status=0
  shift
  env "$@" PROTOBUF_SRC="$src/protobuf" "$runner" --enforce_recommended "$testee" >"$out" 2>&1 || status=$?
  echo "== $engine"
  grep -E "^(ERROR|WARNING), test=" "$out" | head -n 50 || true
  grep -E "CONFORMANCE (SUITE|TEST)" "$out" || tail -n 20 "$out"
  return "$status"
}

status=0
suite native || status=$?
suite wasm CORE_WASM="$wasm" || status=$?
exit "$status"

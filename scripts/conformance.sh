#!/usr/bin/env bash
# Runs protobuf's conformance suite (binary and JSON; text format is skipped
# by the testee) against the core, with recommended tests enforced.
set -euo pipefail
cd "$(dirname "$0")/.."

runner=$(scripts/build-conformance-runner.sh)
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name 'protobuf-src-2.1.1+27.1' | head -n 1)
[[ -n "$src" ]] || { echo "protobuf-src sources not found" >&2; exit 1; }
cargo build -q --release -p grpc-wasm --example conformance_testee

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The runner needs a writable working directory for its failing-tests file.
cd "$(mktemp -d)"
if PROTOBUF_SRC="$src/protobuf" "$runner" --enforce_recommended "$OLDPWD/target/release/examples/conformance_testee" >"$out" 2>&1; then
  status=0
else
  status=$?
fi
grep -E "^(ERROR|WARNING), test=" "$out" | head -n 50 || true
grep -E "CONFORMANCE (SUITE|TEST)" "$out" || tail -n 20 "$out"
exit "$status"

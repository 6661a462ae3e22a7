#!/usr/bin/env bash
# Starts the bundled test servers on free loopback ports, runs the demo
# client through the wasm core, and stops the servers again.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release

pids=()
logs=$(mktemp -d)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$logs"
}
trap cleanup EXIT

# start NAME VAR: runs the server on a free port and sets VAR to its bound
# address. Not called as $(start ...): a subshell's pids+=() would never reach
# the trap, and the servers would outlive the demo.
start() {
  local name=$1 var=$2 log="$logs/$1.out"
  "$bin/$name" --addr 127.0.0.1:0 >"$log" 2>"$logs/$1.err" &
  pids+=($!)
  for _ in $(seq 100); do
    if grep -q '^listening on ' "$log"; then
      printf -v "$var" '%s' "$(sed -n 's/^listening on //p' "$log")"
      return
    fi
    sleep 0.05
  done
  echo "$name did not start:" >&2
  cat "$logs/$1.err" >&2
  exit 1
}

start greeter-server greeter
start routeguide-server routeguide
echo "greeter-server on $greeter, routeguide-server on $routeguide"
"$bin/grpc-demo" --greeter "$greeter" --routeguide "$routeguide" --wasm target/grpc_wasm.wasm

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

# start NAME: runs the server on a free port and prints its bound address.
start() {
  local name=$1 log="$logs/$1.out"
  "$bin/$name" --addr 127.0.0.1:0 >"$log" 2>"$logs/$1.err" &
  pids+=($!)
  for _ in $(seq 100); do
    if grep -q '^listening on ' "$log"; then
      sed -n 's/^listening on //p' "$log"
      return
    fi
    sleep 0.05
  done
  echo "$name did not start:" >&2
  cat "$logs/$1.err" >&2
  exit 1
}

greeter=$(start greeter-server)
routeguide=$(start routeguide-server)
echo "greeter-server on $greeter, routeguide-server on $routeguide"
"$bin/grpc-demo" --greeter "$greeter" --routeguide "$routeguide" --wasm target/grpc_wasm.wasm

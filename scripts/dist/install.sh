#!/usr/bin/env bash
# `make install PREFIX=...`: the OpenResty package from target/dist (make
# dist) into PREFIX: lib/lua/5.1/{liblua_shim.so,grpc_wasm.wasm} (on
# lua_package_cpath; the module next to the shim) and share/lua/5.1/resty/
# (on lua_package_path), the layout of a LuaRocks tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${1:?usage: install.sh PREFIX}
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
stage=target/dist/grpc-wasm-$version
install -d "$prefix/lib/lua/5.1" "$prefix/share/lua/5.1"
install -m 0755 "$stage/lib/liblua_shim.so" "$prefix/lib/lua/5.1/"
install -m 0644 "$stage/lib/grpc_wasm.wasm" "$prefix/lib/lua/5.1/"
(cd "$stage/lua" && find resty -name '*.lua' | while read -r f; do
  install -D -m 0644 "$f" "$prefix/share/lua/5.1/$f"
done)
echo "installed grpc-wasm $version in $prefix: lua_package_path \"$prefix/share/lua/5.1/?.lua;;\"," \
  "lua_package_cpath \"$prefix/lib/lua/5.1/?.so;;\""

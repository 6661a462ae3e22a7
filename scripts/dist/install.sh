#!/usr/bin/env bash
# `make install PREFIX=...`: the OpenResty package into PREFIX, laid out as
# a LuaRocks tree: lib/lua/5.1/{liblua_shim.so,grpc_wasm.wasm} (on
# lua_package_cpath; the module next to the shim) and share/lua/5.1/resty/
# (on lua_package_path). From the build (make wasm, and the shim's release
# build, stripped), so that installing needs no npm or luarocks.
set -euo pipefail
prefix=${1:?usage: install.sh PREFIX}
# PREFIX as given, from where make ran: relative to that, not to the repo.
prefix=$(realpath -m "$prefix")
cd "$(dirname "$0")/../.."
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
install -d "$prefix/lib/lua/5.1" "$prefix/share/lua/5.1"
install -m 0755 -s target/release/liblua_shim.so "$prefix/lib/lua/5.1/"
install -m 0644 target/grpc_wasm.wasm "$prefix/lib/lua/5.1/"
(cd lua-shim/lib && find resty -name '*.lua' | while read -r f; do
  install -D -m 0644 "$f" "$prefix/share/lua/5.1/$f"
done)
echo "installed grpc-wasm $version in $prefix: lua_package_path \"$prefix/share/lua/5.1/?.lua;;\"," \
  "lua_package_cpath \"$prefix/lib/lua/5.1/?.so;;\""

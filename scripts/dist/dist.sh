#!/usr/bin/env bash
# `make dist`: every package in target/dist, each named with the project's
# one version (the workspace's) and listed in SHA256SUMS:
#
#   grpc_wasm.wasm (+ .sha256)               the module, for any proxy-wasm host
#   grpc_wasm_lite.wasm (+ .sha256)          the same without the .proto
#                                            compiler: descriptor sets only
#   oci/                                     it as an OCI image layout (Istio,
#                                            Envoy Gateway), tag <version>
#   grpc_wasm.meta.json                      Kong's filter metadata: the
#                                            configuration's JSON Schema
#   grpc-wasm-config                         writes a filter configuration,
#                                            envoy.yaml or nginx.conf from
#                                            .proto files
#   grpc-wasm-openresty-<v>-linux-<arch>.tar.gz
#                                            shim + module + Lua API + INSTALL
#   grpc-wasm-<v>-1.rockspec, grpc-wasm-<v>-1.linux-<arch>.rock
#                                            the same for LuaRocks
#   grpc-wasm-<v>.tgz                        the npm package (browsers, Node)
#   grpc-wasm-<v>/                           the release archive, unpacked
#                                            (what `make install` copies)
#
# Expects the modules (make wasm wasm-lite), the npm package (make npm) and the shim
# (cargo build --release -p lua-shim --lib): the Makefile's
# dist target builds them first. The archives are the same bytes for the
# same inputs (no times, owners or names of this machine in them).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The archives' modes are the same on every machine, whatever its umask.
umask 022

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
arch=$(uname -m)
# Where releases are published: the rockspec's source URL.
release_url=${RELEASE_URL:-https://github.com/grpc-wasm/grpc-wasm/releases/download}
dist=target/dist
name=grpc-wasm-$version
tarball=grpc-wasm-openresty-$version-linux-$arch.tar.gz
rockspec=grpc-wasm-$version-1.rockspec

rm -rf "$dist"
mkdir -p "$dist"

# The module, and its digest for hosts that check one (Envoy's
# vm_config.code.remote.sha256, Istio's WasmPlugin.sha256).
cp target/grpc_wasm.wasm "$dist/grpc_wasm.wasm"
(cd "$dist" && sha256sum grpc_wasm.wasm > grpc_wasm.wasm.sha256)
cp target/grpc_wasm_lite.wasm "$dist/grpc_wasm_lite.wasm"
(cd "$dist" && sha256sum grpc_wasm_lite.wasm > grpc_wasm_lite.wasm.sha256)

python3 scripts/dist/oci_image.py "$dist/grpc_wasm.wasm" "$dist/oci" "$version"
cp scripts/dist/grpc_wasm.meta.json scripts/dist/grpc-wasm-config "$dist/"

# The OpenResty archive: lib/ (shim and module side by side), lua/, INSTALL.
stage=$dist/$name
mkdir -p "$stage/lib" "$stage/lua"
# The shim the tests ran, without its symbols (20.9 MB with them, 16.2 MB
# without; a profile with thin LTO came to the same 16.2 MB and built
# everything a second time).
strip --strip-all -o "$stage/lib/liblua_shim.so" target/release/liblua_shim.so
cp target/grpc_wasm.wasm "$stage/lib/"
(cd lua-shim/lib && find resty -name '*.lua' -print0 | xargs -0 -I{} cp --parents {} "../../$stage/lua/")
sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$arch/g" scripts/dist/INSTALL.md > "$stage/INSTALL.md"
cp LICENSE "$stage/"
modules=$(cd "$stage" && find lua -name '*.lua' | sort | while read -r path; do
  module=${path#lua/}
  module=${module%.lua}
  printf '      ["%s"] = "%s",\n' "${module//\//.}" "$path"
done)
awk -v modules="$modules" '{ if ($0 == "@MODULES@") print modules; else print }' \
  scripts/dist/grpc-wasm.rockspec.in |
  sed -e "s|@VERSION@|$version|g" -e "s|@RELEASE_URL@|$release_url|g" \
    -e "s|@TARBALL@|$tarball|g" -e "s|@DIR@|$name|g" > "$stage/$rockspec"
cp "$stage/$rockspec" "$dist/"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=go-w,a+rX -C "$dist" -cf - "$name" |
  gzip -9 -n > "$dist/$tarball"

# The binary rock, made by installing the rockspec into a scratch tree.
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
(cd "$stage" && luarocks --lua-version 5.1 make --tree "$tree" "$rockspec" >/dev/null)
(cd "$dist" && luarocks --lua-version 5.1 pack grpc-wasm "$version-1" --tree "$tree" 2>/dev/null >/dev/null)
# luarocks zips copies made now: the same entries with zip's earliest time
# make the rock the same bytes each time.
python3 - "$dist/grpc-wasm-$version-1.linux-$arch.rock" <<'EOF'
import sys
import zipfile

path = sys.argv[1]
with zipfile.ZipFile(path) as rock:
    entries = [(info, rock.read(info)) for info in sorted(rock.infolist(), key=lambda i: i.filename)]
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as rock:
    for info, data in entries:
        fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
        fixed.external_attr, fixed.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
        rock.writestr(fixed, data)
EOF

# The npm package as npm publishes it.
(cd js/npm && npm pack --silent --pack-destination "../../$dist" >/dev/null)

(cd "$dist" && sha256sum grpc_wasm.wasm grpc_wasm_lite.wasm grpc_wasm.meta.json grpc-wasm-config "$tarball" "$rockspec" ./*.rock ./*.tgz |
  sed 's| \./| |' > SHA256SUMS)
echo "$dist:"
(cd "$dist" && ls -l --time-style=+ | sed 1d)

#!/usr/bin/env python3
"""Writes grpc_wasm.wasm as an OCI image layout directory (no registry):
the "compat" variant of Wasm images that Istio's WasmPlugin and Envoy
Gateway's EnvoyExtensionPolicy pull. One gzipped tar layer holds
plugin.wasm; the manifest says module.wasm.image/variant=compat.

usage: oci_image.py <grpc_wasm.wasm> <out dir> <version>

The bytes are the same for the same module: the tar and gzip headers carry
no time, owner or name of this machine. Written with the standard library
rather than a tool, as the image is three small JSON documents and a tar."""

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer_tar(wasm):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        tar.addfile(info, io.BytesIO(wasm))
    return out.getvalue()


def gzipped(data):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(data)
    return out.getvalue()


class Blobs:
    def __init__(self, root):
        self.dir = os.path.join(root, "blobs", "sha256")
        os.makedirs(self.dir)

    def put(self, media_type, data, **extra):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(self.dir, digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}


def canonical(doc):
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_image(wasm_path, out, version):
    with open(wasm_path, "rb") as f:
        wasm = f.read()
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    blobs = Blobs(out)
    tar = layer_tar(wasm)
    layer = blobs.put(LAYER, gzipped(tar))
    # os "linux": the tools that unpack images (umoci, runtimes) know no
    # wasm OS; the architecture says what the layer holds.
    config = blobs.put(CONFIG, canonical({
        "architecture": "wasm", "os": "linux",
        "config": {"Labels": {"org.opencontainers.image.version": version}},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
    }))
    annotations = {
        "module.wasm.image/variant": "compat",
        "org.opencontainers.image.title": "grpc-wasm",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    manifest = blobs.put(MANIFEST, canonical({
        "schemaVersion": 2, "mediaType": MANIFEST, "config": config, "layers": [layer],
        "annotations": annotations,
    }), annotations={"org.opencontainers.image.ref.name": version})
    with open(os.path.join(out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    with open(os.path.join(out, "index.json"), "wb") as f:
        f.write(canonical({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [manifest]}))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    write_image(*sys.argv[1:])

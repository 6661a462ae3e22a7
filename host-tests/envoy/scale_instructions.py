"""How Envoy's instructions per request grow with the message (issue 32): the
filter against Envoy's native grpc_json_transcoder on example.library.v1.Library,
counted by callgrind (all of Envoy's threads), one Envoy per transcoder and one
callgrind dump per size, so that each size's count is its own.

- response: GET /v1/shelves/1/books?page.size=K answers K books (shelf 1 holds
  the largest K, seeded through the filter before counting);
- request: POST /v1/shelves/2/books with a book of K tags (the answer is
  that book, so each tag is read from JSON and printed back).

Both transcoders must grow linearly: the table gives, per size, instructions
per request, per-book (per-tag) increments, and native / ours.

    python3 host-tests/envoy/scale_instructions.py [--requests N] [--sizes 1,10,50,200]
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

from count_instructions import dump, instructions, launch_under_callgrind
from harness.envoy import Server, scratch_dir, wasm_filter
from harness.paths import PROTOS

SERVICE = "example.library.v1.Library"
WARMUP = 100


def descriptor_set(directory):
    """library.proto's descriptor set without SearchBooks, whose
    `response_body` on a non-HttpBody field the native transcoder refuses
    to load (both transcoders get the same set)."""
    from google.protobuf import descriptor_pb2

    out = os.path.join(directory, "library.pb")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--include_imports",
                    f"--descriptor_set_out={out}", "-I", PROTOS, os.path.join(PROTOS, "library.proto")],
                   check=True)
    files = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        files.ParseFromString(f.read())
    for file in files.file:
        for service in file.service:
            kept = [m for m in service.method if m.name != "SearchBooks"]
            del service.method[:]
            service.method.extend(kept)
    with open(out, "wb") as f:
        f.write(files.SerializeToString())
    return out


def book(tags):
    return {"author": "a", "title": "t", "genre": "FICTION", "pages": "300",
            "tags": [f"tag-{i}" for i in range(tags)]}


def seed(port, books):
    """Shelf 1's books, created through the proxy (not counted)."""
    for i in range(books):
        body = json.dumps(book(3) | {"title": f"book {i}"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/shelves/1/books", data=body,
                                         method="POST", headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            if r.status != 200:
                raise RuntimeError(f"seeding answered {r.status}")


def load(port, path, requests, body=None):
    """Sequential requests, each checked to be a 200 of about the expected size."""
    cmd = ["h2load", "-c1", "-m1", "-n", str(requests)]
    if body is not None:
        cmd += ["-d", body, "-H", "content-type: application/json"]
    result = subprocess.run([*cmd, f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True,
                            timeout=1800)
    if f"status codes: {requests} 2xx" not in result.stdout:
        raise RuntimeError(f"not every request to {path} succeeded:\n{result.stdout[-2000:]}")


def check_books(port, sizes):
    """Each size's answer holds that many books, or the counts mean nothing."""
    for k in sizes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/shelves/1/books?page.size={k}", timeout=60) as r:
            books = json.loads(r.read()).get("books", [])
        if len(books) != k:
            raise RuntimeError(f"page.size={k} answered {len(books)} books")


def phases(sizes, directory):
    """(label, path, body file) per measured phase, responses first."""
    out = [(f"response, {k} books", f"/v1/shelves/1/books?page.size={k}", None) for k in sizes]
    for k in sizes:
        body = os.path.join(directory, f"book-{k}.json")
        with open(body, "w") as f:
            json.dump(book(k), f)
        out.append((f"request, {k} tags", "/v1/shelves/2/books", body))
    return out


def count(http_filters, server, directory, requests, sizes, steps, seed_books):
    """Instructions per request in each phase."""
    proc, port, out = launch_under_callgrind(http_filters, server, directory, "bookstore")
    try:
        if seed_books:
            seed(port, seed_books)
        check_books(port, sizes)
        for _, path, body in steps:
            load(port, path, WARMUP, body)
        dump(proc)
        counts = []
        for n, (_, path, body) in enumerate(steps, start=2):
            load(port, path, requests, body)
            dump(proc)
            counts.append(instructions(f"{out}.{n}") / requests)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="1,10,50,200")
    args = parser.parse_args()
    for tool, package in [("valgrind", "valgrind"), ("h2load", "nghttp2-client")]:
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: install it with `apt-get install -y {package}`")
    sizes = [int(k) for k in args.sizes.split(",")]
    server = Server("library-server")
    directory = scratch_dir("grpc-wasm-scale-")
    descriptors = descriptor_set(directory)
    with open(descriptors, "rb") as f:
        ours = wasm_filter({"proto_descriptor_bin": base64.b64encode(f.read()).decode(),
                            "services": [SERVICE]})
    native = {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
        "proto_descriptor": descriptors, "services": [SERVICE]}}
    steps = phases(sizes, directory)
    started = time.time()
    try:
        counts = {"ours": count([ours], server, directory, args.requests, sizes, steps, max(sizes)),
                  "native": count([native], server, directory, args.requests, sizes, steps, 0)}
    finally:
        server.stop()
    print(f"Envoy instructions per request by message size (callgrind, {args.requests} sequential "
          f"requests per size after {WARMUP}; {time.time() - started:.0f} s)")
    print(f"  {'':<22} {'grpc-wasm':>10} {'native':>10} {'native/ours':>12} {'ours per item':>14} "
          f"{'native per item':>16}")
    previous = None
    for i, (label, _, _) in enumerate(steps):
        direction, size = label.split(", ")
        k = int(size.split()[0])
        o, n = counts["ours"][i], counts["native"][i]
        per = f"{'':>14} {'':>16}"
        if previous and previous[0] == direction:
            step = k - previous[1]
            per = f"{(o - previous[2]) / step / 1000:13.2f}k {(n - previous[3]) / step / 1000:15.2f}k"
        print(f"  {label:<22} {o / 1000:9.1f}k {n / 1000:9.1f}k {n / o:12.2f} {per}")
        previous = (direction, k, o, n)

if __name__ == "__main__":
    main()

"""`make bench-js`: the npm package against protobuf.js and
@bufbuild/protobuf (encode + decode per message, in Node), calls per second
through Envoy against a hand-written fetch, and the JSON differences against
protobuf.js on the differential corpus. Ratios from one run."""

import base64
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "differential")]
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"

import corpus  # noqa: E402
from harness.envoy import Server, scratch_dir  # noqa: E402
from harness.web_envoy import web_envoy  # noqa: E402
from test_differential import CLASSES  # noqa: E402


def corpus_file():
    cases = [{"id": i, "type": t, "json": text} for i, t, text in corpus.json_cases()]
    cases += [{"id": i, "type": t, "bin": base64.b64encode(data).decode()}
              for i, t, data in corpus.binary_cases(CLASSES)]
    path = os.path.join(scratch_dir("grpc-wasm-"), "corpus.json")
    with open(path, "w") as f:
        json.dump(cases, f)
    return path


def main():
    servers = {"greeter": Server("greeter-server")}
    proxy = web_envoy(servers)
    try:
        out = subprocess.run(["node", os.path.join(HERE, "bench.mjs"), corpus_file(), f"http://127.0.0.1:{proxy.port}"],
                             check=True, capture_output=True, text=True, cwd=HERE).stdout
    finally:
        proxy.stop()
        servers["greeter"].stop()
    result = json.loads(out)
    print("encode + decode per message, ns (best of 5 rounds); ratio = grpc-wasm / other")
    for size, timings in result["codec"].items():
        ours = timings["grpc-wasm"]
        others = ", ".join(f"{name} {ns:,.0f} ({ours / ns:.2f}x)"
                           for name, ns in timings.items() if name != "grpc-wasm")
        print(f"  {size:6} grpc-wasm {ours:,.0f}; {others}")
    calls = result["calls"]
    print(f"calls/s through Envoy (grpc_web filter, 4 at a time): grpc-wasm {calls['grpc-wasm']:,.0f}, "
          f"fetch + protobuf.js {calls['fetch + protobuf.js']:,.0f} "
          f"({calls['grpc-wasm'] / calls['fetch + protobuf.js']:.2f}x)")
    print(f"JSON differences against protobuf.js on the differential corpus: {result['differences']} of "
          f"{result['cases']} cases (grpc-wasm answers as Google's runtime: make differential)")
    for example in result["examples"]:
        print(f"  e.g. {json.dumps(example)[:300]}")


if __name__ == "__main__":
    main()

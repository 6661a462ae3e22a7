"""Where the filter spends a request's instructions, natively: callgrind on
filter-profile (the proxy-wasm callbacks of one transcoded request through
the core's in-memory proxy), run twice with different request counts so that
start-up cancels out; per case, the instructions per request and the core's
functions that take the most of them (inclusive).

    python3 host-tests/filter/profile_filter.py [--cases hello,books,book] [--top N]
"""

import argparse
import os
import re
import shutil
import subprocess

from harness.envoy import scratch_dir
from harness.paths import BIN

FEW, MANY = 200, 2200


def profile(case, directory):
    """{function: instructions} over the whole run, inclusive."""
    out = os.path.join(directory, f"callgrind-{case}")
    costs = []
    for n in (FEW, MANY):
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.{n}",
                        os.path.join(BIN, "filter-profile"), case, str(n)],
                       check=True, capture_output=True)
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", f"{out}.{n}"],
                              check=True, capture_output=True, text=True).stdout
        costs.append(parse(text))
    return {name: (costs[1].get(name, 0) - costs[0].get(name, 0)) / (MANY - FEW) for name in costs[1]}


def parse(text):
    costs = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(?:\?\?\?:)?(\S.*?)(?: \[.*\])?$", line)
        if match:
            name = match.group(2)
            costs[name] = costs.get(name, 0) + int(match.group(1).replace(",", ""))
    return costs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="hello,books,book")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    directory = scratch_dir("grpc-wasm-profile-")
    try:
        show(args, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def show(args, directory):
    for case in args.cases.split(","):
        costs = profile(case, directory)
        print(f"{case}: {costs['PROGRAM TOTALS'] / 1000:.1f}k instructions per request natively "
              f"(the in-memory proxy's own work included)")
        core = sorted(((n, c) for n, c in costs.items() if n.startswith("grpc_wasm::")), key=lambda x: -x[1])
        if not core:
            raise SystemExit("no grpc_wasm:: function in the profile: is filter-profile built with debug "
                             "line tables? callgrind_annotate then prefixes each name with its file")
        for name, cost in core[:args.top]:
            print(f"  {cost / 1000:7.1f}k  {name[:110]}")


if __name__ == "__main__":
    main()

"""Instruction counts from valgrind's callgrind, for the benchmarks that count
rather than time (two noisy cores): a dump of what was counted since the
last one, and the total a dump file says."""

import subprocess


def dump(proc):
    """callgrind writes what it counted since the last dump to <out>.<n>."""
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)


def instructions(path):
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction count in {path}")

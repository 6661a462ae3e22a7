"""Prometheus' text format, read by the metrics tests (Envoy's
/stats/prometheus, grpc.prometheus()): samples by name and labels, and the
# TYPE of each family."""

import re

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, ((label, value), ...) sorted): value} and {family: kind};
    a line that is neither a comment nor a sample is an error."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a Prometheus sample: {line!r}"
            samples[(m.group(1), tuple(sorted(LABEL.findall(m.group(2) or ""))))] = float(m.group(3))
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))

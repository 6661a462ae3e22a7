"""resty.ffi.grpc's return convention, read from its source: every public
function answers `true, value` or `false, err` (never `nil, err`), so that
a caller's `local ok, res = ...` reads the same everywhere."""

import os
import re

GRPC_LUA = os.path.join(os.path.dirname(__file__), "..", "..", "lua-shim", "lib", "resty", "ffi", "grpc.lua")
PUBLIC = re.compile(r"^function (_M\.|Conn:|Stream:)(\w+)")
ANY_FUNCTION = re.compile(r"^(local )?function ")


def public_returns():
    """(function, line) for every `return` at any depth of a public function."""
    current = None
    with open(GRPC_LUA) as f:
        for number, line in enumerate(f, 1):
            if ANY_FUNCTION.match(line):
                m = PUBLIC.match(line)
                current = m.group(1) + m.group(2) if m else None
            elif current and re.match(r"\s*return\b", line):
                yield current, number, line.strip()


def test_public_functions_answer_true_or_false_never_nil():
    returns = list(public_returns())
    assert len(returns) > 40, "the scan found the public functions' returns"
    wrong = [r for r in returns if re.match(r"return nil\b", r[2])]
    assert wrong == [], wrong


def test_the_readme_example_names_what_connect_returns():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
        readme = f.read()
    assert 'local ok, res = grpc.connect("127.0.0.1:50051")' in readme
    assert "conn = err" not in readme

"""Differential test: grpc-wasm's core against Google's protobuf runtime.

For every JSON case: the same bytes (deterministic serialization) and the
same JSON back (compared parsed); when Google's runtime rejects the input,
ours must reject it too. For every binary case: the same JSON.

Run from the repo root: python3 -m pytest host-tests/differential
(TRANSCODE_BIN overrides the path of the core's batch tool; with
CORE_WASM=path/grpc_wasm.wasm the tool runs the core as that module).
"""

import base64
import json
import math
import os
import subprocess
import tempfile

# The pure-Python runtime is Google's reference for deterministic output:
# it sorts map keys, where the upb backend orders them by its own hash.
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

import corpus

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TRANSCODE = os.environ.get("TRANSCODE_BIN", os.path.join(ROOT, "target", "release", "transcode"))

# Cases where the two implementations legitimately differ. Keep this short;
# each entry says why the difference is acceptable.
KNOWN_DIFFERENCES = {
    "scalar-fDouble-8": "-0.0 in an implicit-presence double: prost-reflect's presence test compares with "
                        "== 0.0, so the field is not written; the decoded value 0.0 compares equal to -0.0",
    "scalar-duplicate-name": "the same field under its JSON and its proto name: the pure-Python runtime keeps "
                             "the last, the core rejects it as the conformance suite's recommended "
                             "FieldNameDuplicateDifferentCasing tests require",
}


def load_reference():
    """Compiles differential.proto with protoc (grpcio-tools), independently of our compiler."""
    import grpc_tools
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    fds = descriptor_pb2.FileDescriptorSet()
    with tempfile.TemporaryDirectory(prefix="grpc-wasm-differential-") as scratch:
        out = os.path.join(scratch, "set.pb")
        rc = protoc.main(["protoc", f"-I{HERE}", f"-I{include}", "--include_imports",
                          f"--descriptor_set_out={out}", "differential.proto"])
        assert rc == 0, "protoc failed on differential.proto"
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in fds.file:
        pool.Add(file)
    names = ["Inner", "Scalars", "Optionals", "Repeated", "Maps", "Choice", "WellKnown", "Nested"]
    classes = {f"diff.{n}": message_factory.GetMessageClass(pool.FindMessageTypeByName(f"diff.{n}")) for n in names}
    return pool, classes


POOL, CLASSES = load_reference()
JSON_CASES = corpus.json_cases()
BINARY_CASES = corpus.binary_cases(CLASSES)


# The npm package's batch tool (js/npm through Node), same line protocol.
PACKAGE_TRANSCODE = os.path.join(ROOT, "host-tests", "js", "transcode.mjs")


class Core:
    """The core's batch tool, one process for the whole run."""

    def __init__(self, tool=TRANSCODE):
        self.proc = subprocess.Popen([tool, HERE, "differential.proto"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the core's transcode tool exited"
        return json.loads(line)


@pytest.fixture(scope="module")
def core():
    c = Core()
    yield c
    c.proc.stdin.close()
    c.proc.wait(timeout=10)


def reference_from_json(type_name, text):
    msg = CLASSES[type_name]()
    json_format.Parse(text, msg, descriptor_pool=POOL)
    return msg


def to_json(msg):
    return json_format.MessageToJson(msg, descriptor_pool=POOL)


def same_json(a, b):
    """Parsed-JSON equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return (a == b and type(a) is type(b)) or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                              and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def check_known(case_id):
    if case_id in KNOWN_DIFFERENCES:
        pytest.skip(f"known difference: {KNOWN_DIFFERENCES[case_id]}")


@pytest.mark.parametrize(("case_id", "type_name", "text"), JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_json_input(core, case_id, type_name, text):
    check_known(case_id)
    try:
        ref = reference_from_json(type_name, text)
    except json_format.ParseError as e:
        ours = core.ask({"type": type_name, "json": text})
        assert "error" in ours, f"reference rejects {text!r} ({e}) but the core accepted it: {ours}"
        return
    ours = core.ask({"type": type_name, "json": text})
    assert "error" not in ours, f"reference accepts {text!r} but the core failed: {ours['error']}"
    ref_bytes = ref.SerializeToString(deterministic=True)
    our_bytes = base64.b64decode(ours["bin"])
    assert our_bytes == ref_bytes, f"bytes differ for {text!r}\n ours: {our_bytes.hex()}\n  ref: {ref_bytes.hex()}"
    ref_json, our_json = json.loads(to_json(ref)), json.loads(ours["json"])
    assert same_json(our_json, ref_json), f"JSON differs for {text!r}\n ours: {our_json}\n  ref: {ref_json}"


@pytest.mark.parametrize(("case_id", "type_name", "data"), BINARY_CASES, ids=[c[0] for c in BINARY_CASES])
def test_binary_input(core, case_id, type_name, data):
    check_known(case_id)
    ours = core.ask({"type": type_name, "bin": base64.b64encode(data).decode()})
    try:
        msg = CLASSES[type_name]()
        msg.ParseFromString(data)
        ref_json = json.loads(to_json(msg))
    except Exception as e:  # the reference rejects the bytes
        assert "error" in ours, f"reference rejects {data.hex()} ({e}) but the core accepted it: {ours}"
        return
    assert "error" not in ours, f"reference decodes {data.hex()} but the core failed: {ours['error']}"
    our_json = json.loads(ours["json"])
    assert same_json(our_json, ref_json), f"JSON differs for {data.hex()}\n ours: {our_json}\n  ref: {ref_json}"


def test_corpus_is_large_enough():
    assert len(JSON_CASES) + len(BINARY_CASES) >= 200


def test_the_npm_package_answers_as_the_core_does(core):
    """The browser and Node package against this core, byte for byte: the
    same protobuf, the same JSON text, the same refusals."""
    package = Core(PACKAGE_TRANSCODE)
    try:
        requests = [{"type": t, "json": text} for _, t, text in JSON_CASES]
        requests += [{"type": t, "bin": base64.b64encode(data).decode()} for _, t, data in BINARY_CASES]
        differences = [(r, core.ask(r), package.ask(r)) for r in requests]
        differences = [d for d in differences if d[1] != d[2]]
        assert not differences, f"{len(differences)} of {len(requests)} differ, e.g. {differences[0]}"
    finally:
        package.proc.stdin.close()
        package.proc.wait(timeout=10)

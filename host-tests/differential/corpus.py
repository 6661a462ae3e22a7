"""The differential corpus: JSON inputs and binary messages for diff.*.

Each JSON case is (id, message type, JSON text). Binary cases are built from
seeded random values, so the corpus is the same on every run.
"""

import json
import random

INT32 = [0, 1, -1, 2147483647, -2147483648, "123", "-5", 1e2, 2147483648, -2147483649, 1.5, "abc", "0x10", True]
INT64 = ["9223372036854775807", "-9223372036854775808", 9007199254740991, "0", -1, "9223372036854775808", "1e3", 1.25]
UINT32 = [0, 4294967295, "4294967295", -1, 4294967296]
UINT64 = ["18446744073709551615", 0, "18446744073709551616", -1]
DOUBLE = [0.1, -1.5e300, "NaN", "Infinity", "-Infinity", 5e-324, "1.5", 0, -0.0, 1e400, "1e5", "nan"]
FLOAT = [3.4028234663852886e38, 1.17549435e-38, 0.1, "NaN", 3.5e38, -2.5, 16777217]
BOOL = [True, False, "true", 0]
STRING = ["", "héllo", "\u0000nul", "😀 emoji", "quote \" and \\ backslash", "\t\n"]
BYTES = ["", "AQID", "-_8", "AQI", "AQI=", "not base64!"]
ENUM = ["RED", "BLUE", 1, -3, 99, "NOPE", None]

SCALAR_VALUES = {
    "fInt32": INT32, "fSfixed32": INT32[:6], "fSint32": INT32[:6],
    "fInt64": INT64, "fSint64": INT64[:4], "fSfixed64": INT64[:4],
    "fUint32": UINT32, "fFixed32": UINT32[:3],
    "fUint64": UINT64, "fFixed64": UINT64[:2],
    "fDouble": DOUBLE, "fFloat": FLOAT,
    "fBool": BOOL, "fString": STRING, "fBytes": BYTES, "fEnum": ENUM,
}


def json_cases():
    cases = []
    for field, values in SCALAR_VALUES.items():
        for i, v in enumerate(values):
            cases.append((f"scalar-{field}-{i}", "diff.Scalars", json.dumps({field: v})))
    cases += [
        ("scalar-proto-name", "diff.Scalars", '{"f_int32": 7, "f_string": "x"}'),
        ("scalar-all", "diff.Scalars", json.dumps({
            "fDouble": 1.25, "fFloat": 2.5, "fInt32": -7, "fInt64": "-70", "fUint32": 7, "fUint64": "70",
            "fSint32": -9, "fSint64": "-90", "fFixed32": 11, "fFixed64": "110", "fSfixed32": -13,
            "fSfixed64": "-130", "fBool": True, "fString": "s", "fBytes": "AAE=", "fEnum": "GREEN"})),
        ("scalar-unknown-field", "diff.Scalars", '{"nope": 1}'),
        ("scalar-null-field", "diff.Scalars", '{"fInt32": null, "fString": null}'),
        ("scalar-duplicate-name", "diff.Scalars", '{"fInt32": 1, "f_int32": 2}'),
        ("scalar-not-object", "diff.Scalars", '[1]'),
        ("optional-zero", "diff.Optionals",
         '{"oInt32": 0, "oString": "", "oBool": false, "oEnum": "COLOR_UNSPECIFIED", "oDouble": 0, "oBytes": ""}'),
        ("optional-set", "diff.Optionals", '{"oInt32": 5, "oEnum": "BLUE"}'),
        ("optional-empty", "diff.Optionals", '{}'),
        ("optional-null", "diff.Optionals", '{"oInt32": null}'),
    ]
    repeated = {
        "rDouble": [1.5, "NaN", -0.0], "rFloat": [0.5, "Infinity"], "rInt32": [1, -1, 2147483647],
        "rInt64": ["1", -2, "9223372036854775807"], "rUint32": [0, 4294967295], "rUint64": ["18446744073709551615"],
        "rSint32": [-1, 1], "rSint64": ["-1"], "rFixed32": [1, 2], "rFixed64": ["3"], "rSfixed32": [-4],
        "rSfixed64": ["-5"], "rBool": [True, False, True], "rString": ["a", "", "é"], "rBytes": ["AQ==", ""],
        "rEnum": ["RED", 2, 99, "BLUE"], "rMessage": [{"a": 1}, {}, {"children": [{"b": "x"}]}],
        "rUnpacked": [1, 2, 300],
    }
    for field, values in repeated.items():
        cases.append((f"repeated-{field}", "diff.Repeated", json.dumps({field: values})))
    cases += [
        ("repeated-empty", "diff.Repeated", '{"rInt32": []}'),
        ("repeated-null", "diff.Repeated", '{"rInt32": null}'),
        ("repeated-null-element", "diff.Repeated", '{"rInt32": [1, null]}'),
        ("repeated-not-list", "diff.Repeated", '{"rInt32": 1}'),
        ("repeated-bad-element", "diff.Repeated", '{"rMessage": [{"a": "x"}]}'),
    ]
    maps = {
        "mString": {"b": "1", "a": "2", "": "3", "é": "4"},
        "mInt32": {"-1": 1, "5": 2, "0": 3, "2147483647": 4},
        "mInt64": {"-9223372036854775808": "min", "10": "ten"},
        "mUint32": {"4294967295": True, "0": False},
        "mUint64": {"18446744073709551615": "AQ==", "1": ""},
        "mSint32": {"-5": 1.5, "5": -2.5},
        "mSint64": {"-6": 0.5, "7": "NaN"},
        "mFixed32": {"3": "RED", "1": 2, "2": 99},
        "mFixed64": {"9": {"a": 1}, "8": {}},
        "mSfixed32": {"-1": "5", "1": -5},
        "mSfixed64": {"-2": "18446744073709551615"},
        "mBool": {"true": "yes", "false": "no"},
        "mMessage": {"z": {"a": 1, "children": [{"a": 2}]}, "y": {"b": "q"}},
    }
    for field, value in maps.items():
        cases.append((f"map-{field}", "diff.Maps", json.dumps({field: value})))
    cases += [
        ("map-all", "diff.Maps", json.dumps(maps)),
        ("map-bad-key", "diff.Maps", '{"mInt32": {"x": 1}}'),
        ("map-bad-bool-key", "diff.Maps", '{"mBool": {"TRUE": "x"}}'),
        ("map-null-value", "diff.Maps", '{"mString": {"a": null}}'),
        ("map-empty", "diff.Maps", '{"mString": {}}'),
    ]
    for i, value in enumerate([{"cInt32": 0}, {"cInt32": 5}, {"cString": ""}, {"cMessage": {}},
                               {"cMessage": {"a": 1}}, {"cEnum": "RED"}, {"cNull": None},
                               {"cBytes": "AQ=="}, {"cInt32": 1, "cString": "x"}, {"after": "z"},
                               {"cEnum": 99}, {"cInt32": None, "cString": "y"}]):
        cases.append((f"oneof-{i}", "diff.Choice", json.dumps(value)))
    well_known = [
        {"timestamp": "1970-01-01T00:00:00Z"},
        {"timestamp": "2024-02-29T12:34:56.789Z"},
        {"timestamp": "2024-02-29T12:34:56.123456789Z"},
        {"timestamp": "2024-02-29T12:34:56.120Z"},
        {"timestamp": "2024-02-29T13:34:56+01:00"},
        {"timestamp": "0001-01-01T00:00:00Z"},
        {"timestamp": "9999-12-31T23:59:59.999999999Z"},
        {"timestamp": "2024-13-01T00:00:00Z"},
        {"timestamp": "1969-12-31T23:59:59.5Z"},
        {"duration": "1.5s"},
        {"duration": "-0.000000001s"},
        {"duration": "315576000000s"},
        {"duration": "315576000001s"},
        {"duration": "0s"},
        {"duration": "1.000001s"},
        {"duration": "1m"},
        {"struct": {"a": [1, "x", None, True, {"b": {}}], "n": 1.5}},
        {"struct": {}},
        {"value": None},
        {"value": 3},
        {"value": "text"},
        {"value": [1, [2, []]]},
        {"value": {"k": False}},
        {"list": [1, "two", None, {"three": 3}]},
        {"list": []},
        {"any": {"@type": "type.googleapis.com/diff.Inner", "a": 1, "b": "x"}},
        {"any": {"@type": "type.googleapis.com/google.protobuf.Duration", "value": "1s"}},
        {"any": {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {"a": 1}}},
        {"any": {"@type": "type.googleapis.com/diff.Nested", "inner": {"a": 2}}},
        {"any": {"@type": "type.googleapis.com/diff.Missing", "a": 1}},
        {"any": {}},
        {"fieldMask": "fooBar,baz.quxQuux"},
        {"fieldMask": ""},
        {"fieldMask": "a,b.c"},
        {"empty": {}},
        {"doubleValue": 1.5}, {"doubleValue": "NaN"}, {"floatValue": 0.25},
        {"int64Value": "5"}, {"int64Value": -5}, {"uint64Value": "18446744073709551615"},
        {"int32Value": 0}, {"uint32Value": 4294967295}, {"boolValue": False}, {"boolValue": True},
        {"stringValue": ""}, {"stringValue": "wrapped"}, {"bytesValue": "AQ=="},
        {"int32Value": None},
        {"timestamps": ["2020-01-01T00:00:00Z", "2021-06-15T08:00:00.5Z"]},
        {"values": {"a": 1, "b": None, "c": [True], "d": {"e": "f"}}},
    ]
    for i, value in enumerate(well_known):
        cases.append((f"wkt-{i}-{next(iter(value))}", "diff.WellKnown", json.dumps(value)))
    cases += [
        ("nested-deep", "diff.Nested", json.dumps({"recursive": {"recursive": {"inner": {"a": 3}}}})),
        ("nested-mixed", "diff.Nested", json.dumps({
            "inner": {"a": 1, "children": [{"a": 2, "children": [{"b": "leaf"}]}]},
            "scalars": {"fInt64": "42", "fEnum": "BLUE"},
            "repeated": {"rString": ["a", "b"], "rEnum": [1, "GREEN"]},
            "maps": {"mString": {"k2": "v2", "k1": "v1"}, "mMessage": {"m": {"a": 9}}},
            "wellKnown": {"timestamp": "2000-01-01T00:00:00Z",
                          "any": {"@type": "type.googleapis.com/diff.Inner", "a": 5}}})),
        ("nested-bad-path", "diff.Nested", json.dumps({"recursive": {"scalars": {"fInt32": "x"}}})),
    ]
    return cases


def binary_cases(classes, n=60):
    """Random messages, seeded, encoded by the reference implementation."""
    rng = random.Random(20261129)
    cases = []
    for i in range(n):
        kind = ["diff.Scalars", "diff.Repeated", "diff.Maps", "diff.Nested", "diff.Choice", "diff.WellKnown"][i % 6]
        msg = classes[kind]()
        fill(msg, rng, depth=0)
        cases.append((f"binary-{i}-{kind}", kind, msg.SerializeToString(deterministic=True)))
    # Unknown enum values and unknown fields survive decoding.
    scalars = classes["diff.Scalars"]()
    scalars.f_enum = 99
    cases.append(("binary-unknown-enum", "diff.Scalars", scalars.SerializeToString()))
    cases.append(("binary-unknown-field", "diff.Scalars", b"\xa0\x06\x01" + scalars.SerializeToString()))
    cases.append(("binary-truncated", "diff.Scalars", b"\x0a\x05ab"))
    return cases


def fill(msg, rng, depth):
    desc = msg.DESCRIPTOR
    if desc.full_name.startswith("google.protobuf."):
        fill_well_known(msg, rng)
        return
    oneof_done = set()
    for field in desc.fields:
        if rng.random() < 0.4:
            continue
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneof_done:
                continue
            oneof_done.add(field.containing_oneof.name)
        is_repeated = field.is_repeated
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            target = getattr(msg, field.name)
            for _ in range(rng.randint(0, 4)):
                key = scalar_value(key_f, rng)
                if val_f.message_type is not None:
                    if depth < 3:
                        fill(target[key], rng, depth + 1)
                else:
                    target[key] = scalar_value(val_f, rng)
        elif field.message_type is not None:
            if depth >= 3 or field.message_type.full_name == "google.protobuf.Any":
                continue
            if is_repeated:
                for _ in range(rng.randint(0, 3)):
                    fill(getattr(msg, field.name).add(), rng, depth + 1)
            else:
                fill(getattr(msg, field.name), rng, depth + 1)
                getattr(msg, field.name).SetInParent()
        elif is_repeated:
            getattr(msg, field.name).extend(scalar_value(field, rng) for _ in range(rng.randint(0, 5)))
        else:
            setattr(msg, field.name, scalar_value(field, rng))


def fill_well_known(msg, rng):
    name = msg.DESCRIPTOR.full_name
    if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        msg.seconds = rng.randint(0, 4_000_000_000) * (1 if name.endswith("Timestamp") else rng.choice([1, -1]))
        msg.nanos = rng.choice([0, 500_000_000, 123_000, 7]) * (1 if msg.seconds >= 0 else -1)
    elif name == "google.protobuf.FieldMask":
        msg.paths.extend(rng.choice(["a", "foo_bar", "x.y_z"]) for _ in range(rng.randint(0, 3)))
    elif name.endswith("Value") and name not in ("google.protobuf.Value", "google.protobuf.ListValue"):
        msg.value = scalar_value(msg.DESCRIPTOR.fields_by_name["value"], rng)
    elif name == "google.protobuf.Struct":
        for _ in range(rng.randint(0, 3)):
            msg.fields[rng.choice(["a", "b", "c"])].number_value = rng.choice([0.5, -3, 1e10])
    elif name == "google.protobuf.Value":
        rng.choice([lambda: setattr(msg, "string_value", "v"), lambda: setattr(msg, "bool_value", True),
                    lambda: setattr(msg, "number_value", 2.5), lambda: msg.struct_value.SetInParent()])()
    elif name == "google.protobuf.ListValue":
        for _ in range(rng.randint(0, 3)):
            msg.values.add().number_value = rng.choice([1, 2.5, -7])


def scalar_value(field, rng):
    from google.protobuf.descriptor import FieldDescriptor as F
    t = field.type
    if t in (F.TYPE_DOUBLE,):
        return rng.choice([0.0, 1.5, -2.25, 1e300, float("inf"), 5e-324, 0.1])
    if t == F.TYPE_FLOAT:
        return rng.choice([0.0, 1.5, -2.25, 3.0e38, 0.1, float("-inf")])
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000)])
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return rng.choice([0, -1, 2**63 - 1, -(2**63), 2**53 + 1])
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return rng.choice([0, 1, 2**32 - 1])
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return rng.choice([0, 1, 2**64 - 1, 2**53 + 1])
    if t == F.TYPE_BOOL:
        return rng.choice([True, False])
    if t == F.TYPE_STRING:
        return rng.choice(["", "a", "héllo", "😀", "with space"])
    if t == F.TYPE_BYTES:
        return rng.choice([b"", b"\x00\x01", bytes(range(7))])
    if t == F.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values] + [99])
    raise ValueError(f"no generator for field type {t}")

#!/usr/bin/env python3
"""Writes the committed seed inputs (seeds/<target>/seed-*), each in its
target's input format (see the comment at the top of each target). Run it
again after changing a format; libFuzzer grows the working corpus from them."""

import gzip
import json
import os
import struct

from google.protobuf import descriptor_pb2

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "seeds", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


def frame(payload, compressed=False):
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(payload)) + payload


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, payload):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def any_of(type_name, value):
    return field(1, ("type.googleapis.com/" + type_name).encode()) + field(2, value)


def frames():
    write("frames", "plain", bytes([0, 20, 0, 3]) + frame(b"hello") + frame(b""))
    zipped = gzip.compress(b"a" * 1000)
    write("frames", "gzip", bytes([3, 20, 12, 7]) + frame(zipped, True) + frame(b"x"))
    write("frames", "bomb", bytes([3, 20, 10, 0]) + frame(gzip.compress(bytes(100000)), True))
    write("frames", "truncated", bytes([0, 10, 0, 1]) + b"\0\0\0\0\x10abc")


EVERYTHING = {
    "doubleValue": 1.5, "floatValue": -0.25, "int32Value": -7, "int64Value": "9007199254740993",
    "uint32Value": 4294967295, "uint64Value": "18446744073709551615", "sint32Value": -1,
    "sint64Value": "-2", "fixed32Value": 3, "fixed64Value": "4", "sfixed32Value": -5,
    "sfixed64Value": "-6", "boolValue": True, "text": "hé\u2028", "data": "aGk=",
    "kind": "KIND_NEGATIVE", "maybe": 0, "doubles": [1, "NaN", "-Infinity"], "floats": [3.4e38],
    "int64s": ["1", 2], "bools": [True], "texts": ["a", ""], "datas": ["_-8="], "kinds": [1, "KIND_ONE"],
    "children": [{"text": "c", "children": [{}]}],
    "byName": {"k": {"kind": 1}}, "byNumber": {"-3": "x"}, "byFlag": {"true": "KIND_ONE"},
    "byId": {"7": "AA=="}, "child": {"choiceText": "deep"},
    "any": {"@type": "type.googleapis.com/grpcwasm.fuzz.Everything", "text": "in any"},
    "anys": [{"@type": "type.googleapis.com/google.protobuf.Duration", "value": "1s"}],
    "structValue": {"a": [1, "b", None, True, {"c": {}}]}, "value": None, "list": [1, [2]],
    "timestamp": "1972-01-01T10:00:20.021+01:00", "duration": "-1.000000001s",
    "mask": "a.b,cD", "empty": {}, "doubleWrapper": 2, "floatWrapper": "Infinity",
    "int64Wrapper": "-9", "uint64Wrapper": 9, "int32Wrapper": 1, "uint32Wrapper": 2,
    "boolWrapper": False, "stringWrapper": "s", "bytesWrapper": "", "timestamps": ["0001-01-01T00:00:00Z"],
}


def as_json(value):
    return json.dumps(value).encode()


def json_seeds():
    write("json", "everything", bytes([0, 0]) + as_json(EVERYTHING))
    write("json", "everything-options", bytes([0x1F, 0]) + as_json({"choice_value": {"x": [1]}}))
    write("json", "any", bytes([0, 1]) + as_json(EVERYTHING["any"]))
    write("json", "struct", bytes([0, 2]) + as_json(EVERYTHING["structValue"]))
    write("json", "value", bytes([0, 3]) + b'[[[{"a":[null]}]]]')
    write("json", "timestamp", bytes([0, 5]) + b'"9999-12-31T23:59:59.999999999Z"')
    write("json", "duration", bytes([0, 6]) + b'"315576000000.999999999s"')
    write("json", "mask", bytes([0, 7]) + b'"fooBar.baz,q"')
    write("json", "int64-wrapper", bytes([0, 8]) + b'"-9223372036854775808"')
    write("json", "bytes-wrapper", bytes([0, 9]) + b'"AQID"')
    any_everything = any_of("grpcwasm.fuzz.Everything", field(14, b"x"))
    write("json", "protobuf-any", bytes([0x20, 0]) + field(60, any_everything) + field(14, b"hi"))
    nested = b""
    for _ in range(30):
        nested = field(50, nested)
    write("json", "protobuf-nested", bytes([0x21, 0]) + nested)


def status(code, message, details):
    out = varint(1 << 3) + varint(code) + field(2, message)
    for detail in details:
        out += field(3, detail)
    return out


def status_details():
    info = any_of("google.rpc.ErrorInfo", field(1, b"REASON") + field(2, b"example.com"))
    unknown = any_of("example.Unknown", b"\x08\x01")
    nested = any_of("grpcwasm.fuzz.Everything", field(60, any_of("google.protobuf.Empty", b"")))
    write("status_details", "three", bytes([0]) + status(3, b"bad", [info, unknown, nested]))
    write("status_details", "empty", bytes([0x1F]) + status(0, b"", []))


def http_rule():
    lines = [b"/v1/{text=shelves/*}/items/{int64_value}", b"/v1/shelves/a/items/42",
             b"kinds=KIND_ONE&child.text=x&int64s=1&int64s=2&by_name=1", b"*", b'{"text":"y"}']
    write("http_rule", "get", b"\n".join(lines))
    lines = [b"/v1/{uint32_value}/**:verb", b"/v1/7/a/b%2F/c:verb", b"child.child.text=%E2%82%AC",
             b"child", b'{"text":"z"}']
    write("http_rule", "patch", b"\n".join(lines))


def header_map():
    pairs = [(b":status", b"200"), (b"content-length", b"3"), (b"te", b"x"), (b"TE", b"trailers")]
    out = struct.pack("<I", len(pairs))
    for key, value in pairs:
        out += struct.pack("<II", len(key), len(value))
    for key, value in pairs:
        out += key + b"\0" + value + b"\0"
    write("header_map", "four", out)


def descriptors():
    with open(os.path.join(HERE, "schema", "fuzz.proto"), "rb") as f:
        write("descriptors", "proto", bytes([1]) + f.read())
    file = descriptor_pb2.FileDescriptorProto(name="a.proto", package="a", syntax="proto3")
    message = file.message_type.add(name="M")
    message.field.add(name="f", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, json_name="f")
    service = file.service.add(name="S")
    service.method.add(name="Call", input_type=".a.M", output_type=".a.M")
    write("descriptors", "set", bytes([0]) + descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString())
    config = {"protos": {"a.proto": 'syntax = "proto3"; package a; message M { string f = 1; }'
                         ' service S { rpc Call(M) returns (M) {} }'},
              "services": ["a.S"], "print_options": {"emit_defaults": True}, "stream_format": "ndjson",
              "callout": {"upstream": "c", "timeout_ms": 5, "metadata": {"x-a": "b"}}}
    write("descriptors", "config", bytes([2]) + json.dumps(config).encode())


def header_values():
    write("header_values", "timeout", bytes([0]) + b"99999999H")
    write("header_values", "status", bytes([1]) + b"13\0bad%20news%E2%82%AC%\0" + status(13, b"x", []))
    write("header_values", "message", bytes([2]) + "100% sûr\n".encode())
    write("header_values", "metadata", bytes([3]) + b"aGk")


def filter_callbacks():
    """Byte-coded callbacks (src/filter.rs): the root (0 transcoding, 1
    callout), then steps of end-of-stream flag, callback and its choices."""
    def text(b):
        return bytes([len(b)]) + b

    request, reply = b'{"name":"ann"}', b"\x0a\x06hi ann"
    headers = bytes([0, 0, 0, 0, 0])  # SayHello, JSON, no other header
    seeds = {
        # The body, gRPC response headers, a framed reply, trailers with status 0.
        "transcode": bytes([0]) + headers + bytes([1, 1]) + text(request) + bytes([0])
        + bytes([0, 2, 0, 1, 0, 0]) + bytes([0, 3, 0]) + text(reply) + bytes([1, 0, 0])
        + bytes([0, 4]) + text(b"0") + text(b"") + text(b"") + bytes([0]),
        # The body, then the call's message and its close with status 0.
        "callout": bytes([1]) + headers + bytes([1, 1]) + text(request) + bytes([0])
        + bytes([0, 6, 0]) + text(reply) + bytes([0, 8, 0, 0]) + text(b""),
        # Half a body, then 4 s pass.
        "deadline": bytes([1]) + headers + bytes([0, 1]) + text(b'{"name":') + bytes([0])
        + bytes([0, 9, 200, 0, 9, 200]),
    }
    for target in ("filter_envoy", "filter_ngx"):
        for name, data in seeds.items():
            write(target, name, data)


def web_reader():
    web = frame(b"hi") + bytes([0x80]) + struct.pack(">I", 16) + b"grpc-status: 0\r\n"
    write("web_reader", "grpc-web", bytes([1, 0, 1, 20, 3]) + web)
    import base64
    write("web_reader", "text", bytes([2, 0, 1, 20, 5]) + base64.b64encode(frame(b"a")) + base64.b64encode(web))
    end = b'{"error":{"code":"not_found","message":"m"},"metadata":{"k":["v"]}}'
    write("web_reader", "connect-stream", bytes([3 | 8, 0, 1, 20, 7]) + frame(b"x") + bytes([2])
          + struct.pack(">I", len(end)) + end)
    write("web_reader", "connect-error", bytes([3, 3, 0, 20, 9])
          + b'{"code":"unavailable","details":[{"type":"google.rpc.ErrorInfo","value":"CgJpZA"}]}')
    zipped = gzip.compress(bytes(5000), mtime=0)
    write("web_reader", "grpc-gzip", bytes([0, 0, 3 | 8, 12, 4]) + frame(zipped, True) + frame(zipped, True))


for make in (frames, web_reader, json_seeds, status_details, http_rule, header_map, descriptors, header_values,
             filter_callbacks):
    make()

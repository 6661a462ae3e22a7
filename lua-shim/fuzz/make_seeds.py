#!/usr/bin/env python3
"""Writes the committed seed inputs (seeds/wire/seed-*) in the wire
target's input format (see the comment at the top of fuzz_targets/wire.rs):
whole exchanges a server may answer, for libFuzzer to vary."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

UNARY, STREAM, SEND, CLOSE_SEND, CANCEL, GATE = 0, 1, 2, 3, 4, 5
HEADERS, GRPC_DATA, RST, GOAWAY, SETTINGS, PING, WINDOW, CLOCK = 7, 9, 10, 11, 12, 13, 14, 15
NAMES = [":status", "content-type", "grpc-status", "grpc-message",
         "grpc-status-details-bin", "x-meta", "x-meta-bin", "grpc-encoding"]


def short(data):
    return bytes([len(data)]) + data


def unary(message=b"hi", timeout_ms=1000):
    return bytes([UNARY]) + struct.pack(">H", timeout_ms) + short(message)


def headers(stream, fields, end_stream=False, split=False):
    out = bytes([HEADERS, int(end_stream) | 2 * int(split), stream, len(fields)])
    for name, value in fields:
        out += bytes([NAMES.index(name)]) + short(value.encode())
    return out


def grpc_data(stream, messages, end_stream=False):
    out = bytes([GRPC_DATA, int(end_stream), stream, len(messages)])
    return out + b"".join(short(m) for m in messages)


OK = [(":status", "200"), ("content-type", "application/grpc")]


def tick(ms):
    return bytes([CLOCK, 0]) + struct.pack(">H", ms)


SEEDS = {
    "unary-ok": unary() + headers(1, OK) + grpc_data(1, [b"\x0a\x02hi"])
    + headers(1, [("grpc-status", "0")], end_stream=True),
    "unary-two-messages": unary() + headers(1, OK) + grpc_data(1, [b"a", b"b"])
    + headers(1, [("grpc-status", "0")], end_stream=True),
    "trailers-only": unary() + headers(1, [*OK, ("grpc-status", "14"), ("grpc-message", "caf%C3%A9")],
                                       end_stream=True, split=True),
    "not-grpc": unary() + headers(1, [(":status", "503")], end_stream=True),
    "stream": bytes([STREAM]) + bytes([SEND, 0]) + short(b"one") + bytes([CLOSE_SEND, 0])
    + headers(1, [*OK, ("x-meta", "m")]) + grpc_data(1, [b"1", b"2"])
    + bytes([GATE, 0, 0]) + grpc_data(1, [b"3"]) + bytes([GATE, 0, 1])
    + headers(1, [("grpc-status", "5"), ("grpc-message", "gone")], end_stream=True),
    "reset-and-goaway": unary() + bytes([STREAM]) + bytes([RST, 1, 8])
    + bytes([GOAWAY, 2, 11]) + short(b"too_many_pings"),
    # The ACK carries the payload of h2's own PING (`Ping::opaque`), which
    # proves the handshake; then a keepalive PING goes unanswered.
    "keepalive": bytes([STREAM]) + bytes([PING, 1]) + bytes.fromhex("3b7cdb7a0b8716b4")
    + tick(31000) + tick(11000),
    "trailers-only-ok": unary() + headers(1, [*OK, ("grpc-status", "0")], end_stream=True),
    "cancel-then-data": bytes([STREAM, CANCEL, 0]) + headers(1, OK) + grpc_data(1, [b"late"])
    + bytes([WINDOW, 0, 0xFF, 0xFF, 0]) + bytes([SETTINGS, 0]) + short(struct.pack(">HI", 4, 0)),
    "partial-frame": unary() + headers(1, OK)
    + bytes([GRPC_DATA, 4 | 1, 1, 1]) + short(b"cut"),
}

if __name__ == "__main__":
    folder = os.path.join(HERE, "seeds", "wire")
    os.makedirs(folder, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(folder, "seed-" + name), "wb") as f:
            f.write(data)

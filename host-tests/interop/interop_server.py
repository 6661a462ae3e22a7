"""gRPC's interop TestService (doc/interop-test-descriptions.md, "Server")
on Python grpcio (C-core): the reference server the Lua client's interop
cases run against.

It listens in plaintext, TLS and mutual TLS (the test-made certificates) and prints
one JSON line, {"plaintext": port, "tls": port, "mtls": port}, when ready. To check that a
request came compressed, as `expect_compressed` asks, the server turns off
C-core's per-message decompression and looks at each message itself: a gzip
member starts 1f 8b, which no protobuf message can (field 3, wire type 7).
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, message_factory

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = os.path.join(HERE, "..", "..", "protos")
SERVICE = "grpc.testing.TestService"
ECHO_INITIAL = "x-grpc-test-echo-initial"
ECHO_TRAILING = "x-grpc-test-echo-trailing-bin"


def load_messages():
    """interop.proto's messages by name: classes built from the descriptor
    set that grpc_tools' protoc writes at start (nothing generated is
    committed)."""
    with tempfile.TemporaryDirectory(prefix="grpc-wasm-interop-") as scratch:
        out = os.path.join(scratch, "interop.pb")
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", "--include_imports",
                        f"--descriptor_set_out={out}", "interop.proto"], check=True)
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    classes = message_factory.GetMessages(files.file)
    return types.SimpleNamespace(**{name.removeprefix("grpc.testing."): cls for name, cls in classes.items()})


pb = load_messages()


def inflate(raw):
    """The message and whether it came compressed."""
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw), True
    return raw, False


def payload(size):
    return pb.Payload(body=b"\0" * size)


def check_compressed(request, compressed, context):
    if request.HasField("expect_compressed") and request.expect_compressed.value != compressed:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"expected compressed={request.expect_compressed.value}, got {compressed}")


def echo_metadata(context):
    """Echoes the two metadata entries the custom_metadata case sends."""
    for key, value in context.invocation_metadata():
        if key == ECHO_INITIAL:
            context.send_initial_metadata(((ECHO_INITIAL, value),))
    trailing = [(k, v) for k, v in context.invocation_metadata() if k == ECHO_TRAILING]
    if trailing:
        context.set_trailing_metadata(tuple(trailing))


def end_with(status, context):
    if status.code != 0:
        context.abort(grpc.StatusCode(_code(status.code)), status.message)


def _code(number):
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code.value
    return grpc.StatusCode.UNKNOWN.value


def empty_call(raw, context):
    return pb.Empty()


def unary_call(raw, context):
    message, compressed = inflate(raw)
    request = pb.SimpleRequest.FromString(message)
    check_compressed(request, compressed, context)
    echo_metadata(context)
    if request.response_compressed.value:
        context.set_compression(grpc.Compression.Gzip)
    end_with(request.response_status, context)
    return pb.SimpleResponse(payload=payload(request.response_size))


def respond(request, context):
    """The responses one StreamingOutputCallRequest asks for."""
    for params in request.response_parameters:
        if params.interval_us:
            time.sleep(params.interval_us / 1e6)
        if params.HasField("compressed"):
            context.set_compression(grpc.Compression.Gzip)
            if not params.compressed.value:
                context.disable_next_message_compression()
        yield pb.StreamingOutputCallResponse(payload=payload(params.size))


def streaming_output_call(raw, context):
    message, _ = inflate(raw)
    request = pb.StreamingOutputCallRequest.FromString(message)
    yield from respond(request, context)
    end_with(request.response_status, context)


def streaming_input_call(requests, context):
    total = 0
    for raw in requests:
        message, compressed = inflate(raw)
        request = pb.StreamingInputCallRequest.FromString(message)
        check_compressed(request, compressed, context)
        total += len(request.payload.body)
    return pb.StreamingInputCallResponse(aggregated_payload_size=total)


def full_duplex_call(requests, context):
    echo_metadata(context)
    for raw in requests:
        message, _ = inflate(raw)
        request = pb.StreamingOutputCallRequest.FromString(message)
        yield from respond(request, context)
        end_with(request.response_status, context)


def half_duplex_call(requests, context):
    held = [pb.StreamingOutputCallRequest.FromString(inflate(raw)[0]) for raw in requests]
    for request in held:
        yield from respond(request, context)


def handlers():
    raw = dict(request_deserializer=None, response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE, {
        "EmptyCall": grpc.unary_unary_rpc_method_handler(empty_call, **raw),
        "UnaryCall": grpc.unary_unary_rpc_method_handler(unary_call, **raw),
        "CacheableUnaryCall": grpc.unary_unary_rpc_method_handler(unary_call, **raw),
        "StreamingOutputCall": grpc.unary_stream_rpc_method_handler(streaming_output_call, **raw),
        "StreamingInputCall": grpc.stream_unary_rpc_method_handler(streaming_input_call, **raw),
        "FullDuplexCall": grpc.stream_stream_rpc_method_handler(full_duplex_call, **raw),
        "HalfDuplexCall": grpc.stream_stream_rpc_method_handler(half_duplex_call, **raw),
        # UnimplementedCall is left out: grpcio answers it UNIMPLEMENTED.
    })


def read(certs, name):
    with open(os.path.join(certs, name), "rb") as f:
        return f.read()


def main():
    certs = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64),
                         options=[("grpc.per_message_decompression", 0)])
    server.add_generic_rpc_handlers((handlers(),))
    plaintext = server.add_insecure_port("127.0.0.1:0")
    pair = ((read(certs, "server.key"), read(certs, "server.pem")),)
    tls = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(pair))
    mtls = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        pair, root_certificates=read(certs, "ca.pem"), require_client_auth=True))
    server.start()
    print(json.dumps({"plaintext": plaintext, "tls": tls, "mtls": mtls}), flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()

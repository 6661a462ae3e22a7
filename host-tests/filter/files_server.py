"""The Files service of protos/files.proto on Python grpcio: methods that
take and return google.api.HttpBody, for the filter's raw bodies (issue 28,
item 2). Prints {"port": N} when it listens."""

import json
import os
import subprocess
import sys
import tempfile
import types
from concurrent import futures

import grpc
import grpc_tools
from google.protobuf import descriptor_pb2, message_factory

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = os.path.join(HERE, "..", "..", "protos")


def load_messages():
    """files.proto's messages and google.api's (HttpBody) by name: classes
    built from the descriptor set that grpc_tools' protoc writes at start
    (nothing generated is committed)."""
    with tempfile.TemporaryDirectory(prefix="grpc-wasm-files-") as scratch:
        out = os.path.join(scratch, "files.pb")
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"-I{well_known}",
                        "--include_imports", f"--descriptor_set_out={out}", "files.proto"], check=True)
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    classes = message_factory.GetMessages(files.file)
    return package(classes, "files"), package(classes, "google.api")


def package(classes, name):
    """The message classes of one proto package, by message name."""
    prefix = f"{name}."
    return types.SimpleNamespace(**{full.removeprefix(prefix): cls for full, cls in classes.items()
                                    if full.startswith(prefix)})


def handlers(files, httpbody):
    def upload(request_bytes, _context):
        return files.Received(request=request_bytes).SerializeToString()

    def put(request_bytes, _context):
        request = files.PutRequest.FromString(request_bytes)
        data = request.name.encode() + b":" + request.file.data
        return httpbody.HttpBody(content_type=request.file.content_type, data=data).SerializeToString()

    def get(request_bytes, context):
        name = files.GetRequest.FromString(request_bytes).name
        if name == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no file {name}")
        if name == "empty":
            return b""
        if name == "evil":
            # A header of the upstream's own, if the filter let it through.
            return httpbody.HttpBody(content_type="text/plain\r\nset-cookie: sid=evil",
                                     data=b"x").SerializeToString()
        return httpbody.HttpBody(content_type="text/plain; charset=utf-8",
                                 data=f"hello {name}".encode()).SerializeToString()

    def download(request_bytes, context):
        name = files.GetRequest.FromString(request_bytes).name
        yield httpbody.HttpBody(content_type="text/csv", data=b"a,b\n").SerializeToString()
        yield httpbody.HttpBody(content_type="text/plain", data=b"1,2\n").SerializeToString()
        if name == "broken":
            context.abort(grpc.StatusCode.DATA_LOSS, "the disk failed")
        yield httpbody.HttpBody(data=b"\x00\xff\n").SerializeToString()

    def describe(request_bytes, _context):
        name = files.GetRequest.FromString(request_bytes).name
        body = httpbody.HttpBody(content_type="image/svg+xml", data=b"<svg/>")
        return files.Described(name=name, body=body).SerializeToString()

    unary = grpc.unary_unary_rpc_method_handler
    return grpc.method_handlers_generic_handler("files.Files", {
        "Upload": unary(upload),
        "Put": unary(put),
        "Get": unary(get),
        "Download": grpc.unary_stream_rpc_method_handler(download),
        "Describe": unary(describe),
        "UploadNested": unary(upload),
    })


def main():
    files, httpbody = load_messages()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handlers(files, httpbody),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"port": port}), flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()

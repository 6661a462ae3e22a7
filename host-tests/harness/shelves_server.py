"""The Bookstore service of protos/shelves.proto on Python grpcio, in the
test's own process, for the transcoder differential suite: it records what
every call received (method, request messages, the x-case and x-via
headers) so that the suite can compare what each transcoder sent upstream.

Its answers depend only on the request, so both transcoders get the same:
Search and Lookup answer with their request; Fail fails with the code it is
given; StreamBooks sends `count` books, then fails if asked."""

import os
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from .paths import PROTOS

SERVICE = "shelves.Bookstore"


def descriptor_set(directory):
    """shelves.proto and its imports as a FileDescriptorSet file, compiled by
    protoc (grpcio-tools), not by the filter's compiler. Envoy's native
    filter reads the same file."""
    out = os.path.join(directory, "shelves.pb")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"-I{well_known}",
                    "--include_imports", f"--descriptor_set_out={out}", "shelves.proto",
                    "google/rpc/status.proto", "google/rpc/error_details.proto"], check=True)
    return out


class Messages:
    """The message classes of a descriptor set."""

    def __init__(self, path):
        files = descriptor_pb2.FileDescriptorSet()
        with open(path, "rb") as f:
            files.ParseFromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            self.pool.Add(file)
        self.service = self.pool.FindServiceByName(SERVICE)

    def cls(self, name):
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(name))

    def to_dict(self, message):
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         descriptor_pool=self.pool)


def error_info(messages, reason):
    """A google.rpc.ErrorInfo in an Any, for grpc-status-details-bin."""
    info = messages.cls("google.rpc.ErrorInfo")(reason=reason, domain="shelves.example",
                                                 metadata={"shelf": "1"})
    detail = messages.cls("google.protobuf.Any")()
    detail.Pack(info)
    return detail


class ShelvesServer:
    def __init__(self, descriptor_path, reflection=False):
        """reflection: serve grpcio-reflection's service (v1alpha) too, from
        the descriptor set's pool."""
        self.messages = Messages(descriptor_path)
        self.received = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self.handlers(),))
        if reflection:
            from grpc_reflection.v1alpha import reflection as grpc_reflection
            grpc_reflection.enable_server_reflection([SERVICE, grpc_reflection.SERVICE_NAME], self.server,
                                                     pool=self.messages.pool)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(grace=None)

    def record(self, method, context, requests):
        headers = dict(context.invocation_metadata())
        key = (headers.get("x-case"), headers.get("x-via"))
        with self.lock:
            self.received.setdefault(key, []).append(
                (method, [self.messages.to_dict(r) for r in requests]))

    def handlers(self):
        m = self.messages
        out = {}
        for method in m.service.methods:
            req = message_factory.GetMessageClass(method.input_type)
            rep = message_factory.GetMessageClass(method.output_type)
            behaviour = getattr(self, method.name)
            kind = (method.client_streaming, method.server_streaming)
            wrap = {
                (False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler,
            }[kind]
            out[method.name] = wrap(self.bind(method.name, behaviour, kind),
                                    request_deserializer=req.FromString,
                                    response_serializer=rep.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, out)

    def bind(self, name, behaviour, kind):
        client_streaming, _server_streaming = kind

        if client_streaming:
            def handler(requests, context):
                requests = list(requests)
                self.record(name, context, requests)
                return behaviour(requests, context)
        else:
            def handler(request, context):
                self.record(name, context, [request])
                return behaviour(request, context)
        return handler

    # The methods, by name: each takes its request (a list for client
    # streams) and answers a message, or yields them for server streams.

    def reply(self, type_name, **fields):
        return self.messages.cls(type_name)(**fields)

    def ListShelves(self, _request, _context):
        shelves = [self.reply("shelves.Shelf", id=1, theme="Fiction", genre=1),
                   self.reply("shelves.Shelf", id=2, theme="Poetry", genre=2)]
        return self.reply("shelves.ListShelvesResponse", shelves=shelves)

    def CreateShelf(self, request, _context):
        shelf = self.reply("shelves.Shelf")
        shelf.CopyFrom(request.shelf)
        if shelf.id == 0:
            shelf.id = 3
        return shelf

    def GetShelf(self, request, context):
        if request.shelf == 404:
            context.abort(grpc.StatusCode.NOT_FOUND, "shelf 404 not found")
        return self.reply("shelves.Shelf", id=request.shelf, theme=f"theme {request.shelf}")

    def DeleteShelf(self, _request, _context):
        return self.reply("google.protobuf.Empty")

    def ArchiveShelf(self, request, _context):
        return self.reply("shelves.Shelf", id=request.shelf, theme="archived")

    def CreateBook(self, request, _context):
        book = self.reply("shelves.Book")
        book.CopyFrom(request.book)
        book.id = book.id or 7
        return book

    def UpdateBook(self, request, _context):
        return request.book

    def PutBook(self, request, _context):
        return request.book

    def GetBook(self, request, _context):
        return self.reply("shelves.Book", id=request.book or 9, title=request.name or "a book",
                          author=f"shelf {request.shelf}", pages=0)

    def Search(self, request, _context):
        return request

    def GetPublicShelf(self, _request, _context):
        return self.reply("shelves.Shelf", id=0, theme="public")

    def LatestFile(self, request, _context):
        return request

    def TwinA(self, request, _context):
        return self.reply("shelves.Shelf", id=request.shelf, theme="twin a")

    def TwinB(self, request, _context):
        return self.reply("shelves.Shelf", id=request.id, theme="twin b")

    def AnyShelf(self, request, _context):
        return self.reply("shelves.Shelf", id=request.shelf, theme="any method")

    def Ping(self, request, _context):
        return self.reply("shelves.Shelf", id=request.shelf, theme="pong")

    def PingAnywhere(self, request, _context):
        return request

    def GetAnyShelf(self, request, _context):
        return self.reply("shelves.Shelf", id=request.shelf, theme="get")

    def Lookup(self, request, _context):
        return request

    def Fail(self, request, context):
        code = next((c for c in grpc.StatusCode if c.value[0] == request.code), grpc.StatusCode.UNKNOWN)
        message = request.message or f"failed with {code.name}"
        if request.details:
            status = self.reply("google.rpc.Status", code=request.code, message=message,
                                details=[error_info(self.messages, "OUT_OF_BOOKS")])
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(code, message)

    def StreamBooks(self, request, context):
        for i in range(request.count):
            yield self.reply("shelves.Book", id=i + 1, title=f"book {i + 1}", author=f"shelf {request.shelf}")
        if request.fail:
            context.abort(grpc.StatusCode.DATA_LOSS, "the shelf collapsed")

    def BulkCreate(self, requests, _context):
        return self.reply("shelves.BulkReply", count=len(requests), titles=[r.title for r in requests])

    def Chat(self, requests, _context):
        yield from requests

    def Upload(self, body, _context):
        return self.reply("shelves.BulkReply", count=1, bytes=len(body.data), content_type=body.content_type)

    def Download(self, request, context):
        if request.shelf == 404:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such download")
        return self.reply("google.api.HttpBody", content_type="text/csv", data=b"id,title\n1,\xff\n")

    def UploadNested(self, request, _context):
        file = request.attachment.file
        return self.reply("shelves.BulkReply", count=1, titles=[request.name], bytes=len(file.data),
                          content_type=file.content_type)

    def DownloadNested(self, request, _context):
        file = self.reply("google.api.HttpBody", content_type="text/plain", data=f"shelf {request.shelf}\n".encode())
        return self.reply("shelves.NestedUpload", name="download",
                          attachment=self.reply("shelves.Attachment", file=file))

    def NoteNested(self, request, _context):
        return request

    def GetCover(self, request, _context):
        image = self.reply("google.api.HttpBody", content_type="image/svg+xml", data=b"<svg/>")
        return self.reply("shelves.Cover", name=f"cover {request.shelf}", image=image)

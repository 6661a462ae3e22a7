"""A gRPC server whose reflection service takes the stream and never
answers: only the client's deadline ends a load from it."""

import threading
from concurrent import futures

import grpc

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


class SilentReflection:
    def __init__(self):
        self.stop_event = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        def never(requests, context):
            while context.is_active() and not self.stop_event.wait(0.05):
                pass
            return iter(())

        handler = grpc.stream_stream_rpc_method_handler(never)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.addr = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self):
        self.stop_event.set()
        self.server.stop(grace=None)

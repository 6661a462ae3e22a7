"""A gRPC server that breaks HTTP/2 itself, below what any gRPC library can be
made to do, written straight on TCP sockets: it answers every request on a
listener the same way, chosen by `mode`:

- `mute`: the TCP connection is taken, and not a byte read or written;
- `http1`: an HTTP/1.1 error page in answer to the client's preface;
- `goaway`: the handshake, then a GOAWAY that refuses the first request;
- `reset:<code>`: the handshake, then RST_STREAM with that HTTP/2 error
  code for each request;
- `partial`: a gRPC 200 and a frame declaring 10 bytes, 3 of them, then the
  connection closes;
- `silent`: the handshake, then nothing: requests are read and never
  answered;
- `stalled`: the handshake and a gRPC 200 to each request, then nothing,
  and the connection is no longer read (a peer stuck mid-response);
- `no_window`: SETTINGS that grant every stream a window of 0 bytes, a
  gRPC 200 to each request, and never a WINDOW_UPDATE: no request data
  can be sent, and whatever comes is read and dropped;
- `wide_window`: SETTINGS and a WINDOW_UPDATE that open every window as
  wide as HTTP/2 allows, a gRPC 200 to each request, and everything that
  comes read and dropped: a server that takes uploads as fast as they
  come;
- `ping_flood`: the handshake, then, once a request is in, PINGs without
  end and nothing read again: every PING owes an ack the server never
  takes;
- `ping_flood_first`: SETTINGS and PINGs without end from the moment the
  connection is taken, not a byte read: the flood starts before the
  client's preface, whatever the client is doing;
- `after_reset`: a gRPC 200 and one empty message to each request, which
  it never ends; once the client resets the stream, 1,000 one-byte DATA
  frames on it: a thousand times what a server has in flight when its
  client cancels.

Request headers are never decoded: every request gets the same answer."""

import contextlib
import socket
import struct
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
# HPACK: ":status: 200" from the static table, then content-type (static
# name 31) as a literal that is not indexed.
GRPC_200 = b"\x88" + b"\x0f\x10" + bytes([16]) + b"application/grpc"

# RFC 9113 error codes by name, for `reset:<name>`.
ERROR_CODES = {"NO_ERROR": 0, "PROTOCOL_ERROR": 1, "INTERNAL_ERROR": 2, "REFUSED_STREAM": 7,
               "CANCEL": 8, "ENHANCE_YOUR_CALM": 11}


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class RawH2:
    def __init__(self, mode):
        self.mode = mode
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns = []
        self.stopped = threading.Event()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def stop(self):
        """Ends every connection now: a shutdown, as a reader's file object
        keeps a closed socket open, and the accept loop wakes only so."""
        self.stopped.set()
        for sock in [self.listener, *self.conns]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def serve(self, conn):
        with contextlib.suppress(OSError):
            self.converse(conn)

    def converse(self, conn):
        if self.mode == "mute":
            self.stopped.wait()
            return
        if self.mode == "http1":
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()
            return
        if self.mode == "ping_flood_first":
            self.flood(conn, frame(SETTINGS, 0, 0))
            return
        reader = conn.makefile("rb")
        if reader.read(len(PREFACE)) != PREFACE:
            conn.close()
            return
        # SETTINGS_INITIAL_WINDOW_SIZE (0x4) = 0 for `no_window`.
        settings = struct.pack(">HI", 0x4, 0) if self.mode == "no_window" else b""
        if self.mode == "wide_window":
            settings = struct.pack(">HI", 0x4, 0x7FFFFFFF)
        conn.sendall(frame(SETTINGS, 0, 0, settings))
        if self.mode == "wide_window":
            conn.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF - 65535)))
        while True:
            head = reader.read(9)
            if len(head) < 9:
                return
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = reader.read(length)
            if kind == SETTINGS and not flags & ACK:
                conn.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                conn.sendall(frame(PING, ACK, 0, payload))
            elif kind == RST_STREAM and self.mode == "after_reset":
                conn.sendall(frame(DATA, 0, stream, b"\x00") * 1000)
            elif kind == HEADERS:
                after = self.answer(conn, stream)
                if after == "closed":
                    return
                if after == "hold":
                    # The connection stays open and is never read again.
                    self.stopped.wait()
                    return

    def flood(self, conn, first=b""):
        """PINGs until the server stops or the peer goes; nothing is read."""
        pings = frame(PING, 0, 0, b"floodfld") * 4096
        conn.sendall(first)
        while not self.stopped.is_set():
            conn.sendall(pings)

    def answer(self, conn, stream):
        if self.mode.startswith("reset:"):
            code = ERROR_CODES[self.mode.split(":", 1)[1]]
            conn.sendall(frame(RST_STREAM, 0, stream, struct.pack(">I", code)))
        elif self.mode == "goaway":
            # Sent once the request is in: the stream is refused by the
            # GOAWAY itself (last stream 0), not by a closed connection.
            conn.sendall(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0) + b"going away"))
        elif self.mode == "partial":
            conn.sendall(frame(HEADERS, END_HEADERS, stream, GRPC_200)
                         + frame(DATA, 0, stream, b"\x00\x00\x00\x00\x0a" + b"abc"))
            # A FIN, and what the proxy still sends read to its end: closing
            # with unread bytes would send a TCP reset, which may make the
            # proxy drop the headers and data before it reads them (then it
            # answers 503 itself, and nothing was cut short).
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(2)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            conn.close()
            return "closed"
        elif self.mode == "after_reset":
            conn.sendall(frame(HEADERS, END_HEADERS, stream, GRPC_200) + frame(DATA, 0, stream, b"\x00" * 5))
        elif self.mode == "stalled":
            conn.sendall(frame(HEADERS, END_HEADERS, stream, GRPC_200))
            return "hold"
        elif self.mode in ("no_window", "wide_window"):
            conn.sendall(frame(HEADERS, END_HEADERS, stream, GRPC_200))
        elif self.mode == "ping_flood":
            self.flood(conn)
            return "closed"
        # "silent": nothing.
        return None

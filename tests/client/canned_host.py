"""A real TLS server on 127.0.0.1 that misbehaves on purpose, for the client's error paths.

It reads each request whole (headers, then a `Content-Length` or chunked body), records it,
and then does what the test's `respond` says: send canned response bytes, send the pieces an
iterator yields as it yields them (an endless or trickling answer: it stops when the client
goes away or the server stops), drop the connection without answering (`DROP`), or stay
silent until the server stops (`SILENT`).
Keep-alive is honoured, so a client can reuse a connection before the misbehaviour.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Literal

from tests.support.host import TlsFiles

DROP: Final = "drop"
SILENT: Final = "silent"
Action = bytes | Iterable[bytes] | Literal["drop", "silent"]


@dataclass(frozen=True)
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class CannedHost:
    respond: Callable[[Received], Action]
    port: int = 0
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    def _record(self, request: Received) -> None:
        with self._lock:
            self.requests.append(request)

    def serve(self, conn: ssl.SSLSocket) -> None:
        reader = _Reader(conn, self.stopping)
        try:
            while not self.stopping.is_set():
                request = reader.request()
                if request is None:
                    return
                self._record(request)
                action = self.respond(request)
                if action == DROP:
                    return
                if action == SILENT:
                    self.stopping.wait()
                    return
                if not isinstance(action, bytes):
                    conn.settimeout(10)  # the client may pause between reads (parsing, GC)
                    for piece in action:
                        if self.stopping.is_set():
                            return
                        conn.sendall(piece)
                    return  # a piecewise answer ends its connection
                conn.sendall(action)
                if b"connection: close" in action.split(b"\r\n\r\n", 1)[0].lower():
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()


class _Reader:
    def __init__(self, conn: ssl.SSLSocket, stopping: threading.Event) -> None:
        self.conn = conn
        self.stopping = stopping
        self.buffer = b""
        conn.settimeout(0.05)

    def _more(self) -> bool:
        while not self.stopping.is_set():
            try:
                chunk = self.conn.recv(65536)
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            if not chunk:
                return False
            self.buffer += chunk
            return True
        return False

    def _line(self) -> bytes | None:
        while b"\r\n" not in self.buffer:
            if not self._more():
                return None
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def _exactly(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            if not self._more():
                return None
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def request(self) -> Received | None:
        while b"\r\n\r\n" not in self.buffer:
            if not self._more():
                return None
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = self._line()
                if size_line is None:
                    return None
                size = int(size_line.split(b";")[0], 16)
                piece = self._exactly(size + 2)
                if piece is None:
                    return None
                if size == 0:
                    break
                body += piece[:-2]
        elif "content-length" in headers:
            data = self._exactly(int(headers["content-length"]))
            if data is None:
                return None
            body = data
        return Received(method, target, headers, body)


@contextmanager
def canned_host(tls: TlsFiles, respond: Callable[[Received], Action]) -> Iterator[CannedHost]:
    """Serve `respond` over TLS (the world's certificate) until the block ends."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.05)
    host = CannedHost(respond, port=listener.getsockname()[1])
    workers: list[threading.Thread] = []

    def accept() -> None:
        while not host.stopping.is_set():
            try:
                plain, _ = listener.accept()
            except TimeoutError:
                continue
            host.connections += 1
            try:
                plain.settimeout(5)
                conn = context.wrap_socket(plain, server_side=True)
            except (OSError, ssl.SSLError):
                plain.close()
                continue
            worker = threading.Thread(target=host.serve, args=(conn,), daemon=True)
            workers.append(worker)
            worker.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield host
    finally:
        host.stopping.set()
        acceptor.join(timeout=5)
        for worker in workers:
            worker.join(timeout=5)
        listener.close()


def http_response(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    close: bool = False,
    reason: str = "X",
    headers: dict[str, str] | None = None,
) -> bytes:
    """Response bytes with a Content-Length (or, when `close`, ended by closing)."""
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if close:
        head.append("Connection: close")
    else:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

"""Stopping a blocking HTTP call when its `CancelToken` is cancelled or idle.

httpx cannot be woken from a blocked `recv` by another thread (closing the response does not),
and a service computing its answer sends nothing the reader could check the token between. So a
watchdog thread polls the token and, once it is cancelled or idle, shuts the call's socket
down: the blocked read ends at once with an EOF, and the caller raises the token's own error
(`CANCELLED`, `TIMEOUT`/`idle-timeout`) instead of the transport error that follows.

The socket comes from httpcore's documented `trace` hook, which hands over the network stream
when a connection (or its TLS layer) is made: the client must not keep connections alive, so
every call makes its own. The watchdog stops when the response is released, before its socket
is closed, so it never shuts down a descriptor number a new connection may reuse. Used by the
OpenAI-compatible chat provider and embedding adapter.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from typing import Any, Final

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError

__all__ = ["SocketWatchdog"]

# How often the watchdog looks at the token: the worst-case delay of a cancellation.
WATCH_INTERVAL_S: Final = 0.05
_SOCKET_EVENTS: Final = ("connection.connect_tcp.complete", "connection.start_tls.complete")
# Runs just before a response's connection is released (and, without keep-alive, closed).
_RELEASE_EVENT: Final = "http11.response_closed.started"


class SocketWatchdog:
    """Shuts one call's socket down once `cancel` is cancelled or idle (see the module doc).
    `start` before the call, pass `trace` as the request's `trace` extension, `stop` after."""

    def __init__(self, cancel: CancelToken, name: str) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._stream: Any = None
        self._tripped: RetrievalError | None = None
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            self._stream = None

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == _RELEASE_EVENT:
            self.stop()
        elif event in _SOCKET_EVENTS:
            with self._lock:
                if self._stopped.is_set():
                    return
                self._stream = info.get("return_value")
                if self._tripped is not None:
                    self._shutdown()  # tripped while connecting

    def raise_if_tripped(self) -> None:
        """Raise the token's error if it tripped the watchdog, or is cancelled or idle now (at
        the moment of a transport error: that is the error to report)."""
        with self._lock:
            tripped = self._tripped
        if tripped is not None:
            raise tripped
        self._cancel.check()

    def _watch(self) -> None:
        while not self._stopped.wait(WATCH_INTERVAL_S):
            try:
                self._cancel.check()
            except RetrievalError as error:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._tripped = error
                    self._shutdown()
                return

    def _shutdown(self) -> None:
        stream = self._stream
        if stream is None:
            return
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            # socket.shutdown, not SSLSocket.shutdown: the TLS object stays to the reader,
            # whose blocked read then ends with an EOF.
            with contextlib.suppress(OSError):  # already closed
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

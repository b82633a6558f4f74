"""Stopping a blocking HTTP call when its `CancelToken` is cancelled or idle.

httpx cannot be woken from a blocked `recv` by another thread (closing the response does not),
and a service computing its answer sends nothing the reader could check the token between. So a
watchdog thread polls the token and, once it is cancelled or idle, shuts the call's socket
down: the blocked read ends at once with an EOF, and the caller raises the token's own error
(`CANCELLED`, `TIMEOUT`/`idle-timeout`) instead of the transport error that follows.

The socket comes from httpcore's documented `trace` hook, which hands over the network stream
when a connection (or its TLS layer) is made. A kept-alive connection is not made again, so a
`SocketSlot` remembers the stream of a client that holds one connection at most (see
`_openai_http.ClientLanes`); the watchdog takes it from there once the request's headers start
out on it, when it is surely that call's connection (an expired one is closed before that). The
watchdog stops when the response is released, before its socket could be closed or lent to
another call, so it never shuts down a descriptor number a new connection may reuse. Used by
the OpenAI-compatible chat provider, embedding adapter and reranker.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from typing import Any, Final

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError

__all__ = ["SocketSlot", "SocketWatchdog"]

# How often the watchdog looks at the token: the worst-case delay of a cancellation.
WATCH_INTERVAL_S: Final = 0.05
_SOCKET_EVENTS: Final = ("connection.connect_tcp.complete", "connection.start_tls.complete")
# Runs just before a response's connection is released (and, without keep-alive, closed).
_RELEASE_EVENT: Final = "http11.response_closed.started"
# Runs for every request, on a new connection or a kept-alive one.
_SEND_EVENT: Final = "http11.send_request_headers.started"


class SocketSlot:
    """The network stream of a client's one connection, as the last call saw it made."""

    __slots__ = ("stream",)

    def __init__(self) -> None:
        self.stream: Any = None

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """Remember the stream of a connection made (for a call without a watchdog)."""
        if event in _SOCKET_EVENTS:
            self.stream = info.get("return_value")


class SocketWatchdog:
    """Shuts one call's socket down once `cancel` is cancelled or idle (see the module doc).
    `start` before the call, pass `trace` as the request's `trace` extension, `stop` after."""

    def __init__(self, cancel: CancelToken, name: str, slot: SocketSlot | None = None) -> None:
        self._cancel = cancel
        self._slot = slot
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
            if self._slot is not None:
                self._slot.trace(event, info)
            self._arm(info.get("return_value"))
        elif event == _SEND_EVENT and self._slot is not None:
            self._arm(self._slot.stream)  # a kept-alive connection, or the one just made

    def _arm(self, stream: Any) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stream = stream
            if self._tripped is not None:
                self._shutdown()  # tripped before the socket was known

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

"""What a client has taken of the bytes written to it, and the bound on a client that takes none.

A client that stops reading while it stays connected (a paused process, a frozen VM, a
client that never reads: its TCP stack keeps acknowledging with a zero window) held its answer's
concurrency slot for as long as it stayed (probe "overload", session 44: a run's 5.7 MB
stream completed in 10 s, and its slot stayed taken until the client left at 72 s).
uvicorn's `send` waits for the transport to drain with no bound, and the slot is released
only when the application returns, so `maxConcurrency` such clients made every other request
`HOST_BUSY` for as long as they liked. Senders that are too slow are cut off
(`headerTimeoutS`, `bodyTimeoutS`); `StallWatch` is the mirror for receivers: a connection
whose writes are paused and whose client has taken no byte for a whole window is aborted.

Progress is measured where the client takes bytes: the bytes it has acknowledged (Linux
`TCP_INFO`, `tcpi_bytes_acked`). The write buffer the application sees is no measure under
TLS: uvloop's TLS layer hands its buffer to the socket's transport whole, and only once that
transport has drained below its low-water mark, so for a client reading a steady 20 KB/s the
buffer stayed at 512 KiB for whole seconds (measured): a window over it cut clients that were
reading. Where `TCP_INFO` cannot be read, any change of the bytes not yet delivered
(`unsent`) counts as progress.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import sys
import termios
from collections.abc import Callable
from typing import Final

# How often a paused connection's progress is looked at (at most; a quarter of a short window).
STALL_POLL_S: Final = 1.0
_OUTQ: Final = getattr(termios, "TIOCOUTQ", None)
# `tcpi_bytes_acked` (Linux 4.1+): a u64 at this offset of `struct tcp_info`, whose layout
# other systems do not share.
_BYTES_ACKED_AT: Final = 120
_TCP_INFO: Final = getattr(socket, "TCP_INFO", None) if sys.platform == "linux" else None


def unsent(transport: asyncio.Transport) -> int:
    """Bytes written to `transport` that its client has not acknowledged yet, as far as they
    can be seen: the TLS layer's buffer and the kernel's send queue (Linux `TIOCOUTQ`, unsent
    and unacknowledged bytes). The loop's own socket buffer in between is not visible; it holds
    bytes only while the kernel's queue is full."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and _OUTQ is not None:
        try:
            queued = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
            size += int.from_bytes(queued, sys.byteorder, signed=True)
        except (OSError, ValueError):
            pass  # not a kernel socket, or already closed: nothing more to see
    return size


def _bytes_acked(transport: asyncio.Transport) -> int | None:
    """The bytes the client has acknowledged on this connection (None: not known here)."""
    sock = transport.get_extra_info("socket")
    if sock is None or _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except (OSError, ValueError):
        return None  # not a TCP socket, or already closed
    if len(info) < _BYTES_ACKED_AT + 8:
        return None  # a kernel older than 4.1
    acked: int = struct.unpack_from("=Q", info, _BYTES_ACKED_AT)[0]
    return acked


def delivery_mark(transport: asyncio.Transport) -> tuple[str, int]:
    """A value that changes whenever the client takes bytes of what was written to it."""
    acked = _bytes_acked(transport)
    return ("acked", acked) if acked is not None else ("unsent", unsent(transport))


class StallWatch:
    """Watches one connection while its writes are paused, and calls `on_stall` once its
    client has taken nothing for `window_s`. A client reading slowly but steadily is never
    cut: each acknowledgement of more bytes (a window update, once the client's kernel has
    freed part of its receive buffer) starts the window again. Event-loop owned, like the
    protocol."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, window_s: float, on_stall: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._window_s = window_s
        self._poll_s = min(STALL_POLL_S, window_s / 4)
        self._on_stall = on_stall
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._mark: tuple[str, int] = ("", 0)
        self._since = 0.0  # when the mark last changed

    def start(self, transport: asyncio.Transport) -> None:
        """Writing paused (the buffers are full): begin watching, if not already."""
        if self._timer is not None:
            return
        self._transport = transport
        self._mark = delivery_mark(transport)
        self._since = self._loop.time()
        self._timer = self._loop.call_later(self._poll_s, self._poll)

    def stop(self) -> None:
        """Writing resumed, or the connection is gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _poll(self) -> None:
        self._timer = None
        assert self._transport is not None
        mark = delivery_mark(self._transport)
        now = self._loop.time()
        if mark != self._mark:
            self._mark, self._since = mark, now
        elif now - self._since >= self._window_s:
            self._on_stall()
            return
        self._timer = self._loop.call_later(self._poll_s, self._poll)

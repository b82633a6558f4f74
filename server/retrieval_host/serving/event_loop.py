"""The host's event loop: uvloop, with each TLS handshake bounded by the header deadline.

A connection is handed to the HTTP protocol (and its header deadline armed) only once its TLS
handshake is done, and asyncio gives a handshake 60 s: a client that opened connections and
sent nothing, or half a ClientHello, held a file descriptor and ~50 KB each for a minute (a
black-box test locked every request out for 57 s with 1,550 of them under a lower fd limit).
uvicorn does not pass `ssl_handshake_timeout` to `create_server`, so this loop adds it.
"""

from __future__ import annotations

from typing import Any

import uvloop

# Set by `bounded_handshakes` in the serving process before its loop starts (one host per
# process; the supervisor's workers each set their own).
_handshake_timeout_s = 60.0


class HandshakeBoundLoop(uvloop.Loop):
    """uvloop, whose TLS servers give a handshake at most the configured time."""

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
            kwargs["ssl_handshake_timeout"] = _handshake_timeout_s
        return await super().create_server(*args, **kwargs)


def bounded_handshakes(seconds: float) -> str:
    """Bound TLS handshakes at `seconds` and name the loop for uvicorn's `loop` (an import
    string other than its own names is the loop factory itself: here, the class)."""
    global _handshake_timeout_s
    _handshake_timeout_s = seconds
    return f"{__name__}:{HandshakeBoundLoop.__name__}"

"""Server-Sent Events shared by the streamed routes (runs, ingest): who asks for a stream, and
the one way a stream is answered (sse-starlette, heartbeat comments, no caching or buffering)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request

from retrieval_host.http.shutdown import Shutdown

# Line ends to SSE only at CR and LF, but to `str.splitlines` and httpx's `iter_lines` (which
# the README shows raw-HTTP readers) also at these: inside an event's JSON they cut it in two
# (probe B, session 37: an answer or a question holding U+2028). Escaped, the JSON is the same.
_LINE_BREAKERS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def json_event(body: Mapping[str, Any], event: str) -> ServerSentEvent:
    """An event whose `data` is `body` as JSON on one line for every line splitter."""
    return ServerSentEvent(
        data=json.dumps(body, ensure_ascii=False).translate(_LINE_BREAKERS), event=event
    )


def wants_stream(request: Request) -> bool:
    """Whether the request's `Accept` prefers `text/event-stream` to the JSON answer.

    Media types compare case-insensitively and each range's `q` counts (RFC 9110 12.5.1):
    the stream is sent when `text/event-stream` is named with a `q` above 0 and no range that
    JSON matches (`application/json`, `application/*`, `*/*`) has a higher one. So
    `text/event-stream;q=0` means JSON, and `*/*` alone means JSON (the stream must be asked
    for by name).
    """
    stream = json = 0.0
    for media, q in _ranges(request.headers.get("accept", "")):
        if media == "text/event-stream":
            stream = max(stream, q)
        elif media in ("application/json", "application/*", "*/*"):
            json = max(json, q)
    return stream > 0 and stream >= json


def _ranges(accept: str) -> list[tuple[str, float]]:
    """Each media range of an `Accept` value, lower-cased, with its weight (1 when absent or
    unreadable: a malformed weight is not a refusal)."""
    ranges = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(max(float(value.strip()), 0.0), 1.0)
                except ValueError:
                    q = 1.0
        if media:
            ranges.append((media.lower(), q))
    return ranges


def event_stream(
    events: AsyncIterator[ServerSentEvent], *, heartbeat_s: float, shutdown: Shutdown | None
) -> EventSourceResponse:
    """The response that sends `events`, with a heartbeat comment every `heartbeat_s`."""
    return EventSourceResponse(
        events,
        ping=heartbeat_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        # sse-starlette would cut every stream the moment the server is told to stop; the
        # stream ends itself instead (see `shutdown.py`), with a final event.
        shutdown_grace_period=shutdown.grace_s if shutdown is not None else 0,
    )

"""Server-Sent Events shared by the streamed routes (runs, ingest): who asks for a stream, and
the one way a stream is answered (sse-starlette, heartbeat comments, no caching or buffering)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request

from retrieval_host.http.shutdown import Shutdown


def wants_stream(request: Request) -> bool:
    """Whether the request's `Accept` names `text/event-stream`."""
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip() == "text/event-stream" for part in accept.split(","))


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

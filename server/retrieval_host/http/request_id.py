"""The outermost middleware: a request id for every request, and the last line of defence.

The id is generated here (never taken from the caller, so logs cannot be forged into
correlating unrelated requests), stored in `scope["state"]`, echoed in `X-Request-Id` and
carried by every problem body. An exception that escapes everything else is logged with that
id and answered with a bare `INTERNAL` problem: nothing of the exception reaches the caller;
a request the server cancels (its shutdown deadline) is answered with the shutdown problem.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http.problems import send_problem
from retrieval_host.http.shutdown import shutting_down

REQUEST_ID_HEADER: Final = b"x-request-id"
logger = logging.getLogger("retrieval_host.http")


# Marks an exception already logged with its request id (by the framework's handler, before
# it answered), so the middleware does not log it twice when it is re-raised.
_LOGGED: Final = "_retrieval_host_logged"


def log_unexpected(exc: BaseException, scope: Scope) -> None:
    """Log an unexpected exception once, with the request id, before the caller is answered."""
    if getattr(exc, _LOGGED, False):
        return
    setattr(exc, _LOGGED, True)
    logger.error(
        "unhandled error in %s %s",
        scope.get("method"),
        scope.get("path"),
        exc_info=exc,
        extra={"request_id": request_id_of(scope)},
    )


def new_request_id() -> str:
    """32 lowercase hex digits, random (128 bits) and unique in practice.

    From the process's PRNG (seeded from the OS at start), not `uuid4()`: `os.urandom` releases
    the GIL, and the event loop then waited for it behind the worker threads, ~0.16 ms per
    request under load. A request id correlates log lines; it is not a secret.
    """
    return f"{random.getrandbits(128):032x}"


def internal_error() -> RetrievalError:
    return RetrievalError(ErrorCode.INTERNAL, "The host failed to handle this request.")


def request_id_of(scope: Scope) -> str:
    """The id `RequestIdMiddleware` gave this request ("-" outside of it, e.g. in unit tests)."""
    state = scope.get("state")
    if isinstance(state, dict):
        value = state.get("request_id")
        if isinstance(value, str):
            return value
    return "-"


def note_subject(scope: Scope, subject: str) -> None:
    """Record whom the request authenticated as (the access log names the subject, never the
    token)."""
    state = scope.get("state")
    if isinstance(state, dict):
        state["subject"] = subject


def note_stream_failure(scope: Scope, code: str, reason: str | None) -> None:
    """Record that a streamed response (status 200, already sent) ended in a `*.failed` event:
    the access line and the metrics say so (they showed a success, a black-box test)."""
    state = scope.get("state")
    if isinstance(state, dict):
        state["stream_failure"] = (code, reason)


def stream_failure_of(scope: Scope) -> tuple[str, str | None] | None:
    """The code and reason `note_stream_failure` recorded for this request, if any."""
    state = scope.get("state")
    value = state.get("stream_failure") if isinstance(state, dict) else None
    return value if isinstance(value, tuple) else None


def subject_of(scope: Scope) -> str | None:
    """The subject `note_subject` recorded for this request, if it authenticated."""
    state = scope.get("state")
    value = state.get("subject") if isinstance(state, dict) else None
    return value if isinstance(value, str) else None


class RequestIdMiddleware:
    """Pure ASGI: assigns the request id and turns escaped exceptions into `INTERNAL`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        state = dict(scope.get("state") or {})
        state["request_id"] = request_id
        scope = {**scope, "state": state}
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                headers.append((REQUEST_ID_HEADER, request_id.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            log_unexpected(exc, scope)
            if not started:
                await send_problem(send_with_id, internal_error(), request_id)
        except asyncio.CancelledError:
            # The server cancels a request's task only when it gives up on it: at the end of
            # the shutdown grace period. Left to the server, the caller would get a plain-text
            # 500; it gets the shutdown problem, then the cancellation goes on.
            if not started:
                await send_problem(send_with_id, shutting_down(), request_id)
            raise

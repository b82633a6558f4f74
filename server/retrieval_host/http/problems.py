"""`application/problem+json` responses: the one place an error becomes HTTP.

Every error path of the host (routes, middleware, the server protocol's header deadline)
renders through `wire.problems.problem_body`, so all of them carry the same fields and a
request id.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from starlette.responses import Response
from starlette.types import Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http.auth import WWW_AUTHENTICATE
from retrieval_host.wire.problems import (
    PROBLEM_MEDIA_TYPE,
    encode_problem,
    problem_body,
    retry_after,
)

logger = logging.getLogger("retrieval_host.http")
# Failures of a model or service the host calls, whose details carry that service's words.
UPSTREAM_CODES = frozenset(
    {ErrorCode.EMBEDDING_FAILED, ErrorCode.PROVIDER_FAILED, ErrorCode.RERANK_FAILED}
)


def error_response(
    error: RetrievalError, request_id: str, *, run_id: str | None = None
) -> Response:
    """How a route's error is answered: its problem, with the headers its code calls for
    (logged when the host or its upstream is at fault). `run_id`: the run it ended."""
    log_failure(error, request_id)
    headers: dict[str, str] | None = None
    if error.code is ErrorCode.UNAUTHENTICATED:
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
    elif error.code is ErrorCode.HOST_BUSY:
        headers = {"Retry-After": "1"}  # as the limits middleware's own refusals say
    elif (wait := retry_after(error)) is not None:
        headers = {"Retry-After": str(wait)}  # the model's own word (a 429's Retry-After)
    if run_id is None:
        run_id = error.run_id
    return problem_response(error, request_id, headers=headers, run_id=run_id)


def log_failure(error: RetrievalError, request_id: str) -> None:
    """Log an error the host or its upstream is at fault for (5xx), as a JSON answer or a
    stream's `*.failed` event reports it."""
    if error.status < 500:
        return
    if error.code in UPSTREAM_CODES:
        # An upstream's message can quote what it was sent (passages, the question): it
        # goes to the caller in the problem body, never into the host's log.
        logger.warning(
            "%s: %s", error.code.value, error.reason or "failed", extra={"request_id": request_id}
        )
    else:
        logger.warning(
            "%s: %s%s",
            error.code.value,
            error.detail,
            _cause(error),
            extra={"request_id": request_id},
        )


def _cause(error: RetrievalError) -> str:
    """The driver's own words a store attached (`translating`), for the operator: its first
    line only (PostgreSQL's DETAIL lines can quote values). A black-box test filled the disk:
    the log said "the database failed" and never why."""
    cause = error.__cause__
    if cause is None:
        return ""
    words = str(cause).strip().splitlines()
    return f" ({type(cause).__name__}: {words[0][:300] if words else 'no message'})"


def problem_response(
    error: RetrievalError,
    request_id: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    run_id: str | None = None,
) -> Response:
    code = status if status is not None else error.status
    body = problem_body(
        error.code,
        error.detail,
        request_id,
        status=code,
        reason=error.reason,
        run_id=run_id,
        retry_after_s=retry_after(error),
    )
    return Response(
        encode_problem(body),
        status_code=code,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


async def send_problem(
    send: Send,
    error: RetrievalError,
    request_id: str,
    *,
    status: int | None = None,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Send a whole problem response from pure ASGI middleware."""
    code = status if status is not None else error.status
    body = problem_body(error.code, error.detail, request_id, status=code, reason=error.reason)
    payload = encode_problem(body)
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode("ascii")),
                (b"content-length", str(len(payload)).encode("ascii")),
                *extra_headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})

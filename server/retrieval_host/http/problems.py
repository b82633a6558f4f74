"""`application/problem+json` bodies: the one place an error becomes HTTP.

Every error path of the host (routes, middleware, the server protocol's header deadline)
renders through `problem_body`, so all of them carry the same fields and a request id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from starlette.responses import Response
from starlette.types import Send

from retrieval_host.core.errors import STATUS, TITLES, ErrorCode, RetrievalError

PROBLEM_MEDIA_TYPE = "application/problem+json"


def problem_type(code: ErrorCode) -> str:
    """A stable URI naming the problem type (a URN: it promises no web page)."""
    return "urn:retrieval-host:problem:" + code.value.lower().replace("_", "-")


def problem_body(
    code: ErrorCode,
    detail: str,
    request_id: str,
    *,
    status: int | None = None,
    reason: str | None = None,
) -> dict[str, object]:
    """The problem document. `status` overrides the table only for HTTP-level statuses that
    have no code of their own (404/405 for an unknown route or method, 408 for a slow client)."""
    body: dict[str, object] = {
        "type": problem_type(code),
        "title": TITLES[code],
        "status": status if status is not None else STATUS[code],
        "code": code.value,
        "detail": detail,
        "requestId": request_id,
    }
    if reason is not None:
        body["reason"] = reason
    return body


def encode_problem(body: dict[str, object]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def problem_response(
    error: RetrievalError,
    request_id: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    code = status if status is not None else error.status
    body = problem_body(error.code, error.detail, request_id, status=code, reason=error.reason)
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

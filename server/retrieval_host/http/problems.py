"""`application/problem+json` responses: the one place an error becomes HTTP.

Every error path of the host (routes, middleware, the server protocol's header deadline)
renders through `wire.problems.problem_body`, so all of them carry the same fields and a
request id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from starlette.responses import Response
from starlette.types import Send

from retrieval_host.core.errors import RetrievalError
from retrieval_host.wire.problems import PROBLEM_MEDIA_TYPE, encode_problem, problem_body


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

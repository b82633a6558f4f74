"""The `application/problem+json` document (RFC 9457) of an error code.

The HTTP layer sends it as a response (`http/problems.py`); a run stream sends it inside its
`run.failed` event (`wire/runs.py`). Both render through `problem_body`, so every error path
carries the same fields and a request id.
"""

from __future__ import annotations

import json
import math

from retrieval_host.core.errors import STATUS, TITLES, ErrorCode, RetrievalError, TransientError

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
    run_id: str | None = None,
    retry_after_s: int | None = None,
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
    if run_id is not None:
        body["runId"] = run_id
    if retry_after_s is not None:
        body["retryAfter"] = retry_after_s
    return body


def retry_after(error: RetrievalError) -> int | None:
    """Whole seconds the service behind a failure asked to be left alone (a model's 429 or 503
    with `Retry-After`), for the caller to decide when to try again; None when it did not say."""
    if isinstance(error, TransientError) and error.retry_after_s is not None:
        # at most a day: a service's 10^20 s is passed on as no integer parser overflows
        return max(math.ceil(min(error.retry_after_s, MAX_RETRY_AFTER_S)), 0)
    return None


MAX_RETRY_AFTER_S = 86_400


def encode_problem(body: dict[str, object]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

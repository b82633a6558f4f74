"""`wire.problems`: what a problem says of a failure's Retry-After."""

from __future__ import annotations

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError, TransientError
from retrieval_host.wire.problems import MAX_RETRY_AFTER_S, problem_body, retry_after


def _transient(seconds: float | None) -> TransientError:
    error = TransientError(ErrorCode.PROVIDER_FAILED, "rate limited", reason="rate-limited")
    error.retry_after_s = seconds
    return error


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(None, None), (0.0, 0), (0.2, 1), (30.0, 30), (1e20, MAX_RETRY_AFTER_S), (1e400, 86_400)],
)
def test_a_services_retry_after_is_whole_seconds_of_at_most_a_day(
    seconds: float | None, said: int | None
) -> None:
    # Probe V (session 35): a model's `Retry-After: 99999999999999999999` was passed on as
    # 100000000000000000000, past what an int64 parser reads.
    assert retry_after(_transient(seconds)) == said
    body = problem_body(ErrorCode.PROVIDER_FAILED, "d", "r", retry_after_s=said)
    assert body.get("retryAfter") == said


def test_an_error_that_is_not_transient_says_no_retry_after() -> None:
    assert retry_after(RetrievalError(ErrorCode.PROVIDER_FAILED, "d")) is None

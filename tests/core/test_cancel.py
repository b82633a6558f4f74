"""`CancelToken.wait`: a backoff that a cancel or the inactivity timeout ends early."""

from __future__ import annotations

import threading
import time

import pytest

from retrieval_host.core.cancel import CancelToken, LinkedCancel
from retrieval_host.core.errors import ErrorCode, RetrievalError


def test_a_wait_ends_when_the_inactivity_timeout_runs_out() -> None:
    token = CancelToken(idle_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(RetrievalError) as error:
        token.wait(60.0)
    assert error.value.code is ErrorCode.TIMEOUT
    assert time.monotonic() - started < 30.0  # the deadline, not the minute asked for


def test_a_wait_ends_when_cancelled_from_another_thread() -> None:
    token = CancelToken()
    worker, outcome = _wait_in_a_thread(token)
    token.cancel()
    worker.join(30.0)
    assert not worker.is_alive() and outcome == [ErrorCode.CANCELLED]


def test_a_wait_without_a_cancel_or_deadline_returns() -> None:
    token = CancelToken(idle_timeout_s=60.0)
    token.wait(0.01)
    token.wait(0.0)
    assert not token.cancelled


def _wait_in_a_thread(token: CancelToken) -> tuple[threading.Thread, list[ErrorCode]]:
    waiting = threading.Event()
    outcome: list[ErrorCode] = []

    def wait() -> None:
        waiting.set()
        try:
            token.wait(600.0)
        except RetrievalError as error:
            outcome.append(error.code)

    worker = threading.Thread(target=wait)
    worker.start()
    assert waiting.wait(30.0)
    return worker, outcome


@pytest.mark.parametrize("depth", [1, 2])
def test_a_linked_wait_ends_when_the_caller_is_cancelled(depth: int) -> None:
    # Probe B (session 35): a run's backoff (a LinkedCancel of the request's token) went on
    # for its whole Retry-After after the client had left.
    caller = CancelToken()
    token: CancelToken = caller
    for _ in range(depth):
        token = LinkedCancel(token, idle_timeout_s=600.0)
    worker, outcome = _wait_in_a_thread(token)
    caller.cancel()
    worker.join(30.0)
    assert not worker.is_alive() and outcome == [ErrorCode.CANCELLED]


def test_a_linked_token_of_a_cancelled_caller_is_cancelled_and_its_own_cancel_stays_its_own() -> (
    None
):
    caller = CancelToken()
    caller.cancel()
    with pytest.raises(RetrievalError) as error:
        LinkedCancel(caller).wait(600.0)
    assert error.value.code is ErrorCode.CANCELLED
    other = CancelToken()
    part = LinkedCancel(other)
    part.cancel()
    assert part.cancelled and not other.cancelled


def test_a_linked_wait_ends_at_the_caller_s_inactivity_timeout() -> None:
    caller = CancelToken(idle_timeout_s=0.2)
    with pytest.raises(RetrievalError) as error:
        LinkedCancel(caller).wait(600.0)
    assert error.value.code is ErrorCode.TIMEOUT

"""Graceful shutdown of the work in flight when the server is told to stop (SIGTERM).

The server (`serving/server.py`) stops accepting connections and calls `Shutdown.begin`. In-flight
requests and open run streams then have until the *cutoff* to finish on their own; at the
cutoff every cancel token still registered is cancelled, so synchronous work stops at its next
check (an index leaves the previous revision, a run is recorded as cancelled) and each open run
stream ends with a final `run.failed` (`CANCELLED`, reason `shutdown`). A stream whose worker
does not answer within the wind-down gets that final event from the HTTP layer itself, and a
request whose work does not return within it gets a `CANCELLED` (reason `shutdown`) problem the
same way (`answer`): work on a busy machine can take seconds to reach its next check. The
cutoff leaves part of the grace period (a quarter, at most 5 s) for this wind-down, so that
everything has ended before uvicorn's own deadline (`timeout_graceful_shutdown`, the whole
grace period) cancels what is left; a request cancelled there anyway is still answered with a
problem body (`request_id.py`), never uvicorn's plain-text 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any, TypeVar

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError

logger = logging.getLogger("retrieval_host.http")
T = TypeVar("T")

MAX_WIND_DOWN_S = 5.0


def shutting_down() -> RetrievalError:
    """The error that in-flight work ends with when the host stops before it finished."""
    return RetrievalError(
        ErrorCode.CANCELLED,
        "The host is shutting down; the request was cancelled. Retry it.",
        reason="shutdown",
    )


class Shutdown:
    """Tracks the cancel tokens of work in flight and cancels them at the shutdown cutoff.

    Everything except `begin`'s timer runs on the event loop; cancelling a token is
    thread-safe (the work that checks it runs in worker threads).
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.wind_down_s = min(MAX_WIND_DOWN_S, grace_s / 4)
        self.cutoff_s = grace_s - self.wind_down_s
        # Weak: a token whose request ended (however it ended) leaves by itself.
        self._tokens: weakref.WeakSet[CancelToken] = weakref.WeakSet()
        # Futures of the streams waiting for their next event, woken at the cutoff. Futures,
        # not one asyncio.Event: an app may serve on more than one event loop (tests).
        self._waiters: set[asyncio.Future[None]] = set()
        # What the request handlers await instead of their work's own future (`answer`).
        self._answers: set[asyncio.Future[Any]] = set()
        self._cut_at: float | None = None
        self.draining = False

    @property
    def past_cutoff(self) -> bool:
        return self._cut_at is not None

    def track(self, token: CancelToken) -> CancelToken:
        """Register the token of work that must stop at the cutoff (work begun after it stops
        at its first check)."""
        if self._cut_at is not None:
            token.cancel()
        self._tokens.add(token)
        return token

    def release(self, token: CancelToken) -> None:
        """The work of this token has ended (tokens not released leave when collected)."""
        self._tokens.discard(token)

    def begin(self) -> None:
        """Stop taking new work (the server closed its listeners) and arm the cutoff."""
        if self.draining:
            return
        self.draining = True
        logger.info(
            "shutting down: %d requests in flight, cutoff in %.1f s",
            len(self._tokens),
            self.cutoff_s,
        )
        asyncio.get_running_loop().call_later(self.cutoff_s, self.cut)

    def cut(self) -> None:
        """Cancel every registered token now (the cutoff, or a test)."""
        if self._cut_at is not None:
            return
        self._cut_at = time.monotonic()
        tokens = list(self._tokens)
        if tokens:
            logger.warning("shutdown cutoff: cancelling %d unfinished requests", len(tokens))
        for token in tokens:
            token.cancel()
        for waiter in list(self._waiters):
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)
        for answer in list(self._answers):
            answer.get_loop().call_soon_threadsafe(self._abandon_after_wind_down, answer)

    def answer(self, work: asyncio.Future[T]) -> asyncio.Future[T]:
        """A future with `work`'s outcome, or failing with `shutting_down()` when the work has
        not returned by the middle of the wind-down (then the request is answered without it;
        its token is cancelled, so the work still stops at its next check). Call on the event
        loop of `work`."""
        answer: asyncio.Future[T] = work.get_loop().create_future()

        def settle(done: asyncio.Future[T]) -> None:
            self._answers.discard(answer)
            if answer.done():  # abandoned already
                if not done.cancelled():
                    done.exception()  # retrieved: a late failure is not worth a warning
            elif done.cancelled():
                answer.cancel()
            elif (error := done.exception()) is not None:
                answer.set_exception(error)
            else:
                answer.set_result(done.result())

        self._answers.add(answer)
        work.add_done_callback(settle)
        if self._cut_at is not None:
            self._abandon_after_wind_down(answer)
        return answer

    def _abandon_after_wind_down(self, answer: asyncio.Future[Any]) -> None:
        assert self._cut_at is not None
        delay = self._cut_at + self.wind_down_s / 2 - time.monotonic()
        answer.get_loop().call_later(max(delay, 0.0), _abandon, answer)

    async def next_item(self, queue: asyncio.Queue[T]) -> T | None:
        """The queue's next item; None once past the cutoff and the wind-down is over with
        nothing more arriving (the caller then ends the stream itself)."""
        if not queue.empty():
            return queue.get_nowait()
        if self._cut_at is None:
            cut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            getter = asyncio.ensure_future(queue.get())
            self._waiters.add(cut)
            try:
                either: set[asyncio.Future[Any]] = {getter, cut}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._waiters.discard(cut)
                cut.cancel()
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()
        assert self._cut_at is not None
        if not queue.empty():
            return queue.get_nowait()
        remaining = self._cut_at + self.wind_down_s / 2 - time.monotonic()
        try:
            return await asyncio.wait_for(queue.get(), max(remaining, 0.0))
        except TimeoutError:
            return None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _abandon(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        # The work may be past its last cancel check (a write committing): say so.
        answer.set_exception(
            RetrievalError(
                ErrorCode.CANCELLED,
                "The host is shutting down and did not wait for this request to finish; it may "
                "still take effect. Retry it.",
                reason="shutdown",
            )
        )

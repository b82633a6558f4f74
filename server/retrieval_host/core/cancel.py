"""Cooperative cancellation and inactivity deadlines for synchronous work."""

from __future__ import annotations

import threading
import time
import weakref

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import TimeoutReason


class CancelToken:
    """Set by whoever owns the request (a disconnect, a task cancel); checked by the work.

    `idle_timeout_s` is an inactivity timeout: it counts from the last `progress()` call, so only
    real progress (embedding, authorization, scanning, generation) keeps work alive.
    """

    def __init__(self, idle_timeout_s: float | None = None) -> None:
        self._event = threading.Event()
        self._idle = idle_timeout_s
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._linked: weakref.WeakSet[CancelToken] = weakref.WeakSet()

    def cancel(self) -> None:
        """Cancel this token and every token linked to it (`LinkedCancel`), waking their
        waits."""
        self._event.set()
        with self._lock:
            linked = list(self._linked)
        for token in linked:
            token.cancel()

    def _link(self, token: CancelToken) -> None:
        with self._lock:
            self._linked.add(token)
        if self._event.is_set():
            token.cancel()

    def _idle_left(self) -> float | None:
        """Seconds until the inactivity timeout runs out; None without one."""
        if self._idle is None:
            return None
        return self._idle - (time.monotonic() - self._last)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def progress(self) -> None:
        self._last = time.monotonic()

    def idle_expired(self) -> bool:
        return self._idle is not None and time.monotonic() - self._last > self._idle

    def wait(self, seconds: float) -> None:
        """Wait up to `seconds` (a backoff), ending at once when cancelled and at the latest
        when the inactivity timeout runs out (a wait is not progress); then `check`."""
        left = self._idle_left()
        if left is not None:
            seconds = min(seconds, max(left, 0.0) + 0.001)
        if seconds > 0:
            self._event.wait(seconds)
        self.check()

    def check(self) -> None:
        if self._event.is_set():
            raise RetrievalError(ErrorCode.CANCELLED, "The request was cancelled.")
        if self.idle_expired():
            raise RetrievalError(
                ErrorCode.TIMEOUT,
                "No progress within the inactivity timeout the request set.",
                reason=TimeoutReason.IDLE_TIMEOUT,
            )


class LinkedCancel(CancelToken):
    """A token of part of a caller's work: cancelled when the caller's is, or on its own (and
    then only this part stops: the caller's token and its other work are left alone), with an
    inactivity timeout of its own if given. Progress counts for both."""

    def __init__(self, parent: CancelToken, idle_timeout_s: float | None = None) -> None:
        super().__init__(idle_timeout_s)
        self._parent = parent
        # The caller's cancel wakes this token's waits (a run's backoff went on for its whole
        # Retry-After after the client had left: a black-box probe).
        parent._link(self)

    @property
    def cancelled(self) -> bool:
        return self._parent.cancelled or super().cancelled

    def progress(self) -> None:
        self._parent.progress()
        super().progress()

    def idle_expired(self) -> bool:
        return self._parent.idle_expired() or super().idle_expired()

    def _idle_left(self) -> float | None:
        lefts = [x for x in (self._parent._idle_left(), super()._idle_left()) if x is not None]
        return min(lefts) if lefts else None

    def check(self) -> None:
        self._parent.check()
        super().check()

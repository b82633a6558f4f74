"""Work that must not wait: on a thread inside `refusing_waits()`, what would wait for a model,
a reload or a lock held for long raises `WouldWait` instead.

The HTTP layer runs short searches on its event loop (`http/inline.py`), where a wait holds
every other request up; it runs them inside `refusing_waits()`, and a search that raises
`WouldWait` runs again, whole, on a search thread, where waiting is fine. What refuses:

- `QueryEmbedder.embed` when the query's vector is not cached (a model call, or a batch of
  other queries' model calls to wait for);
- the SQLite store when its index must be reloaded (another connection committed), and
  when a lock it takes is held for longer than `LOCK_PATIENCE_S` (a writer applying a large
  commit or waiting for SQLite's write lock: `locked`).

Other threads are not affected: the flag is per thread. `WouldWait` is a `BaseException`,
like a cancellation: code between the refusal and the HTTP layer that handles `Exception`
(an application's authorizer that fails closed, a translation into a typed error) must not
turn it into a denial or an error. A search that moved has run partly: an authorizer may see
its request twice (as when a read is overtaken, `core.search`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Protocol

__all__ = ["LOCK_PATIENCE_S", "WouldWait", "locked", "refuse_wait", "refusing_waits"]

# How long a thread refusing waits tries for a lock. Searches hold the store's locks briefly
# (a capture of their grant), but a holder may have to win the interpreter back first, which
# takes up to Python's switch interval (5 ms); a writer holds them for a whole commit.
LOCK_PATIENCE_S: Final = 0.005

_refusing = threading.local()


class WouldWait(BaseException):
    """Raised instead of waiting, on a thread inside `refusing_waits()`; says for what."""


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


@contextmanager
def refusing_waits() -> Iterator[None]:
    """Within the block, this thread gets `WouldWait` where it would otherwise wait."""
    before = getattr(_refusing, "on", False)
    _refusing.on = True
    try:
        yield
    finally:
        _refusing.on = before


def refuse_wait(what: str) -> None:
    """Raise `WouldWait(what)` on a thread refusing waits; nothing otherwise."""
    if getattr(_refusing, "on", False):
        raise WouldWait(what)


@contextmanager
def locked(lock: _Lock, what: str) -> Iterator[None]:
    """`with lock:`, except that a thread refusing waits tries for `LOCK_PATIENCE_S` only,
    then raises `WouldWait(what)`."""
    if getattr(_refusing, "on", False):
        if not lock.acquire(timeout=LOCK_PATIENCE_S):
            raise WouldWait(what)
    else:
        lock.acquire()
    try:
        yield
    finally:
        lock.release()

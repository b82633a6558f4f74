"""Leases on running runs: how a reader tells a run in progress from one whose host stopped.

A run record is `running` from `begin` until its host records how it ended. A host that stops
mid-way (killed, crashed, its machine lost) records nothing, so a reader could not tell a live
run from a dead one: `GET /v1/runs/{id}` answered `running` for good, and a retry with the
same idempotency key was told to wait for an end that would never come.

So each record begun by this release carries a lease (`lease_until`, seconds since the epoch
on the store's clock: the process's for SQLite, the database server's for PostgreSQL, so
replicas with skewed clocks agree). The host sets it at `begin` and a `LeaseKeeper` thread
renews the leases of all its running runs every quarter lease, in one statement (a
sixteenth after a renewal failed). A reader that
finds a `running` record whose lease has lapsed marks it `failed` with error code
`INTERRUPTED`, in one statement guarded by the status and the lapse, so a renewal and the
marking never both take effect. Records written by an earlier release (no lease) are never
marked. A host that closes its store with runs still going (a shutdown that outlived its
grace) marks them itself.

A host that only stalls for a whole lease (a store unreachable that long) may see its run
marked while it still runs; the result it records when the run ends replaces the mark.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["DEFAULT_LEASE_S", "INTERRUPTED", "UNFINISHED_RUN", "LeaseKeeper"]

DEFAULT_LEASE_S: Final = 60.0
# The error code of a run whose lease lapsed (`GET /v1/runs/{id}`'s `errorCode`).
INTERRUPTED: Final = "INTERRUPTED"
# The records whose end a host may still record: running, or marked interrupted while their
# host was only stalled (what it records then replaces the mark).
UNFINISHED_RUN: Final = (
    f"(status = 'running' OR (status = 'failed' AND error_code = '{INTERRUPTED}'))"
)
_RENEWALS_PER_LEASE: Final = 4

_log = logging.getLogger("retrieval_host.runs")


class LeaseKeeper:
    """The runs one store began in this process, their leases renewed by one thread.

    `renew(run_ids, lease_s)` extends the leases of those still `running` by `lease_s` from
    now; `interrupt(run_ids)` marks those still `running` as interrupted (at close). Both
    may raise: a failed renewal is logged and tried again at the next turn.
    """

    def __init__(
        self,
        renew: Callable[[Sequence[str], float], None],
        interrupt: Callable[[Sequence[str]], None],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        name: str = "run-leases",
    ) -> None:
        if not (math.isfinite(lease_s) and lease_s > 0):
            raise ValueError("lease_s must be positive and finite")
        self.lease_s = lease_s
        self._renew = renew
        self._interrupt = interrupt
        self._name = name
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, run_id: str) -> None:
        """A run this process began: renew its lease until `discard`."""
        with self._lock:
            self._live.add(run_id)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def discard(self, run_id: str) -> None:
        """The run ended (recorded or not): its lease is no longer renewed."""
        with self._lock:
            self._live.discard(run_id)

    def close(self) -> None:
        """Stop renewing and mark the runs still going as interrupted (best effort: a store
        that cannot write leaves them to lapse). Idempotent."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
            left, self._live = sorted(self._live), set()
        if thread is not None:
            thread.join()
        if left:
            try:
                self._interrupt(left)
            except Exception as error:  # closing goes on; the leases lapse instead
                _log.warning(
                    "%d running run(s) not marked interrupted at close (%s); their leases "
                    "lapse within %.0f s",
                    len(left),
                    type(error).__name__,
                    self.lease_s,
                )

    def _loop(self) -> None:
        wait = self.lease_s / _RENEWALS_PER_LEASE
        while not self._stop.wait(wait):
            wait = self.lease_s / _RENEWALS_PER_LEASE
            with self._lock:
                live = sorted(self._live)
            if not live:
                continue
            try:
                self._renew(live, self.lease_s)
            except Exception as error:  # tried again soon; a lapse marks them meanwhile
                wait /= _RENEWALS_PER_LEASE
                _log.warning(
                    "run leases not renewed for %d run(s) (%s)", len(live), type(error).__name__
                )

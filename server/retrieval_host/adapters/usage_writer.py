"""Usage records written in groups, off the request's thread (group commit).

Every search that embeds its query, every ingest and every run ends with a usage record
(`core.usage`). Written by the operation's own thread, each was one transaction: on SQLite an
fsync'd commit that held one of the host's few search threads until the disk answered, and took
a share of the interpreter lock for its statement: 0.48 ms of wall time and 0.23 ms of CPU
per record on this project's 2-core machine, against 0.018 ms to queue one here.

A `UsageWriter` takes the records and returns at once; one background thread writes whatever
has accumulated, in one call of the store's own write (one transaction), then the records that
arrived meanwhile, and so on: under load a commit holds as many records as arrived during the
previous one, and no record waits for a timer. A record is in the store within one commit of
its operation's answer (milliseconds), not before it: an operator's `retrieval-host usage` run
at that very moment may miss it, and a host killed outright (SIGKILL, power loss) loses what it
had not written yet. `flush` waits for every record added before it (the store's own reads call
it, so a reader in the same process sees its own writes); `close` flushes and stops the thread.
Like any sink, it never raises: a write that fails is logged and its records dropped here;
records added after `close` too. A group the store refuses for a record's values (a token count
beyond its 64-bit column: one reranker's `2**70` dropped 22 records of other searches and runs,
probe H, session 40) is written again one record at a time, so only the records it refuses are
lost; a store that cannot be written (`RetrievalError`) loses the group without a retry, which
would only wait out the same outage once per record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Final

from retrieval_host.adapters._store_rules import usage_not_recorded
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.usage import UsageRecord

__all__ = ["MAX_PENDING", "UsageWriter"]

# Records waiting beyond this (a store that stopped answering while requests go on) are dropped
# and logged rather than held in memory without bound.
MAX_PENDING: Final = 100_000


class StoreClosed(Exception):
    """Records added after the writer was closed."""


class UsageWriter:
    """One store's usage records, written in groups by one thread (see the module docstring).

    `write` writes one group in one transaction, or raises: `RetrievalError` when the store
    cannot be written, another exception when it refuses the records' values. The writer
    logs and drops what could not be written (`UsageSink.record_usage` never raises).
    """

    def __init__(
        self,
        write: Callable[[Sequence[UsageRecord]], None],
        *,
        name: str = "usage-writer",
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._write = write
        self._name = name
        self._max_pending = max_pending
        self._changed = threading.Condition()
        self._pending: list[UsageRecord] = []
        self._added = 0  # records ever accepted
        self._done = 0  # records written (or dropped by a failed write)
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, records: Sequence[UsageRecord]) -> None:
        """Queue the records for the next group; never blocks on the store, never raises."""
        if not records:
            return
        with self._changed:
            if self._closed:
                refused: BaseException | None = StoreClosed("the usage writer is closed")
            elif len(self._pending) + len(records) > self._max_pending:
                refused = OverflowError(f"more than {self._max_pending} records waiting")
            else:
                refused = None
                self._pending.extend(records)
                self._added += len(records)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._changed.notify_all()
        if refused is not None:
            usage_not_recorded(records, refused)

    def flush(self) -> None:
        """Return once every record added before this call is written (or dropped)."""
        with self._changed:
            target = self._added
            while self._done < target:
                self._changed.wait()

    def close(self) -> None:
        """Write what is pending, stop the thread; later records are dropped. Idempotent."""
        with self._changed:
            self._closed = True
            thread = self._thread
            self._changed.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                group, self._pending = self._pending, []
                if not group:  # closed, nothing left
                    return
            try:
                self._write_group(group)
            except BaseException as error:  # never lose the thread
                usage_not_recorded(group, error)
            with self._changed:
                self._done += len(group)
                self._changed.notify_all()

    def _write_group(self, group: Sequence[UsageRecord]) -> None:
        """One group in one transaction; refused for its values, each record alone."""
        try:
            self._write(group)
            return
        except RetrievalError as error:  # the store, not a record, failed
            usage_not_recorded(group, error)
            return
        except Exception as error:
            if len(group) == 1:
                usage_not_recorded(group, error)
                return
        for i, record in enumerate(group):
            try:
                self._write([record])
            except RetrievalError as error:  # the store failed meanwhile: the rest with it
                usage_not_recorded(group[i:], error)
                return
            except Exception as error:
                usage_not_recorded([record], error)

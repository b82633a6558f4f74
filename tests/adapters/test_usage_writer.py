"""Usage records written in groups by one thread (`adapters.usage_writer`): nothing lost, the
records that arrive during a commit go together in the next one, readers can wait for their
own writes, closing writes what is queued, and a failing store loses only its group."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.adapters.usage_writer import UsageWriter
from retrieval_host.core.usage import UsageRecord


def _record(n: int) -> UsageRecord:
    return UsageRecord(
        at=f"2026-12-03T00:00:{n % 60:02d}Z",
        subject=f"s{n}",
        operation="search",
        kind="embedding",
        provider="local-minilm",
        account="local",
        model="m",
        corpus="library",
        requests=1,
        input_tokens=n,
    )


class HeldStore:
    """A write function that holds each write until the test lets it go."""

    def __init__(self) -> None:
        self.groups: list[list[UsageRecord]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.fail_next = False

    def write(self, records: Sequence[UsageRecord]) -> None:
        self.entered.release()
        assert self.release.acquire(timeout=30), "the test never released the write"
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("disk gone")
        self.groups.append(list(records))


def test_records_arriving_during_a_commit_go_together_in_the_next_one() -> None:
    store = HeldStore()
    writer = UsageWriter(store.write)
    writer.add([_record(0)])
    assert store.entered.acquire(timeout=30)  # the first commit is under way
    for n in range(1, 6):
        writer.add([_record(n)])  # returns at once, though the store is busy
    store.release.release()
    assert store.entered.acquire(timeout=30)
    store.release.release()
    writer.flush()
    assert store.groups == [[_record(0)], [_record(n) for n in range(1, 6)]]
    writer.close()


def test_flush_waits_for_every_record_added_before_it() -> None:
    store = HeldStore()
    writer = UsageWriter(store.write)
    writer.add([_record(1), _record(2)])
    flushed = threading.Event()

    def flush() -> None:
        writer.flush()
        flushed.set()

    waiter = threading.Thread(target=flush)
    waiter.start()
    assert store.entered.acquire(timeout=30)
    assert not flushed.is_set()  # the write has not returned yet
    store.release.release()
    waiter.join(timeout=30)
    assert flushed.is_set() and store.groups == [[_record(1), _record(2)]]
    writer.close()


def test_close_writes_what_is_queued_and_later_records_are_logged_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = HeldStore()
    writer = UsageWriter(store.write)
    writer.add([_record(1)])
    assert store.entered.acquire(timeout=30)
    writer.add([_record(2)])
    closing = threading.Thread(target=writer.close)
    closing.start()
    store.release.release()
    assert store.entered.acquire(timeout=30)
    store.release.release()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert store.groups == [[_record(1)], [_record(2)]]
    with caplog.at_level(logging.WARNING):
        writer.add([_record(3)])
    assert "usage not recorded: 1 record(s) dropped (StoreClosed)" in caplog.text
    assert store.groups == [[_record(1)], [_record(2)]]


def test_a_failed_write_loses_its_group_only(caplog: pytest.LogCaptureFixture) -> None:
    store = HeldStore()
    writer = UsageWriter(store.write)
    store.fail_next = True
    with caplog.at_level(logging.WARNING):
        writer.add([_record(1)])
        assert store.entered.acquire(timeout=30)
        store.release.release()
        writer.flush()
    assert "usage not recorded: 1 record(s) dropped (RuntimeError)" in caplog.text
    writer.add([_record(2)])
    assert store.entered.acquire(timeout=30)
    store.release.release()
    writer.flush()
    assert store.groups == [[_record(2)]]
    writer.close()


def test_records_beyond_the_bound_are_dropped_not_held(caplog: pytest.LogCaptureFixture) -> None:
    store = HeldStore()
    writer = UsageWriter(store.write, max_pending=2)
    writer.add([_record(0)])
    assert store.entered.acquire(timeout=30)  # taken: no longer pending
    writer.add([_record(1), _record(2)])
    with caplog.at_level(logging.WARNING):
        writer.add([_record(3)])
    assert "usage not recorded: 1 record(s) dropped (OverflowError)" in caplog.text
    store.release.release()
    assert store.entered.acquire(timeout=30)
    store.release.release()
    writer.flush()
    assert store.groups == [[_record(0)], [_record(1), _record(2)]]
    writer.close()


def test_the_sqlite_store_loses_no_concurrent_record_and_they_are_durable_at_close(
    tmp_path: Path,
) -> None:
    store = SqliteRunStore.open(tmp_path / "runs.db")
    commits: list[int] = []
    write = store._write_usage  # count the transactions the writer makes

    def counted(records: Sequence[UsageRecord]) -> None:
        commits.append(len(records))
        write(records)

    store._usage = UsageWriter(counted)

    def record(k: int) -> None:
        for n in range(50):
            store.record_usage([_record(k * 50 + n)])

    threads = [threading.Thread(target=record, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = store.read_usage()  # waits for this process's queued records
    assert sorted(r.input_tokens for r in records) == list(range(400))
    assert sum(commits) == 400
    store.close()
    # Closed and reopened: everything was durable.
    reopened = SqliteRunStore.open(tmp_path / "runs.db")
    assert len(reopened.read_usage()) == 400
    reopened.close()

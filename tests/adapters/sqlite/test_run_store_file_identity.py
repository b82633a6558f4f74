"""The run records' file (`runs.db`) truncated, replaced or removed under a running host:
every write, every read and the readiness probe refuse with `STORE_UNAVAILABLE`, as the vector
store's do (`test_file_identity`), rather than acknowledge runs and usage into a lost file."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.service import RetrievalService
from retrieval_host.core.usage import UsageRecord
from retrieval_host.driver import Driver
from tests.support.file_damage import DAMAGES, remove
from tests.support.run_records import a_result


def _record(run_id: str) -> RunRecord:
    return RunRecord(run_id, "alice", f"key-{run_id}", "fp-1", "running", "2026-12-01T00:00:00Z")


def _usage() -> UsageRecord:
    return UsageRecord(
        "2026-12-01T00:00:01Z", "alice", "search", "embedding", "local", "local", "m", "d", 1, 3
    )


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[tuple[SqliteRunStore, Path]]:
    """A run store in a private directory holding one running and one completed run."""
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    db = directory / "runs.db"
    store = SqliteRunStore.open(db)
    try:
        assert store.begin(_record("done")) is None
        store.complete("done", a_result("done"))
        assert store.begin(_record("going")) is None
        store.record_usage([_usage()])
        assert len(store.read_usage()) == 1
        yield store, db
    finally:
        store.close()


def _refused(call: Callable[[], object]) -> RetrievalError:
    with pytest.raises(RetrievalError) as refused:
        call()
    assert refused.value.code is ErrorCode.STORE_UNAVAILABLE, refused.value
    return refused.value


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_run_database_refuses_writes_reads_and_the_probe(
    recording: tuple[SqliteRunStore, Path],
    damage: Callable[[Path], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A black-box test removed runs.db under a serving host: runs completed (200), usage was
    # acknowledged, /readyz said ready, and the restart found none of it.
    store, db = recording
    store.check_readable()
    damage(db)
    refused = _refused(store.check_readable)
    assert "restart the host on an intact file" in refused.detail
    _refused(lambda: store.begin(_record("later")))
    _refused(lambda: store.complete("going", a_result("going")))
    _refused(lambda: store.finish("going", "failed", "INTERNAL"))
    _refused(lambda: store.get("done"))  # not answered from the connection's cache
    _refused(lambda: store.prune("2027-01-01T00:00:00Z"))
    # Usage is written off the request's thread: the sink never raises, it logs the drop.
    with caplog.at_level(logging.WARNING):
        store.record_usage([_usage()])
        _refused(store.read_usage)  # waits for the queued record's write first
    assert "usage not recorded: 1 record(s) dropped (STORE_UNAVAILABLE sqlite-error)" in caplog.text


def test_readiness_asks_the_run_records_too(recording: tuple[SqliteRunStore, Path]) -> None:
    store, db = recording
    # As `wiring` and the example application build it: the run store is the usage sink.
    driver = Driver(RetrievalService([]), runs=RunEngine(None, {}, store, usage=store))
    assert driver.stores_answer()
    remove(db)
    assert not driver.stores_answer()


def test_a_removed_run_database_stops_the_next_open_naming_the_file(
    recording: tuple[SqliteRunStore, Path],
) -> None:
    # The restart said "the database file is missing" beside a store whose retrieval.sqlite
    # was there: the operator could not tell which file was meant.
    _, db = recording
    remove(db)  # while the store is open: its log stays beside it
    refused = _refused(lambda: SqliteRunStore.open(db))
    assert refused.reason == "missing-store"
    assert f"the database file {db} is missing" in refused.detail
    assert "remove runs.db-wal and runs.db-shm" in refused.detail
    assert not db.exists()

"""Leases on running runs in the SQLite run store (`adapters.run_leases`): a run whose host
was killed reads as interrupted once its lease lapses; a live one never does."""

from __future__ import annotations

from pathlib import Path

import apsw

from retrieval_host.adapters.sqlite import SqliteRunStore
from tests.support.run_leases import (
    check_close_interrupts_only_unfinished_runs,
    check_lapsed_run_reads_interrupted,
    check_renewed_run_stays_running,
    check_stalled_host_result_replaces_the_mark,
    killed_mid_run,
)


def _runs_db(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    return tmp_path / "runs.db"


def test_a_run_whose_host_was_killed_reads_as_interrupted_once_its_lease_lapses(
    tmp_path: Path,
) -> None:
    path = _runs_db(tmp_path)
    killed_mid_run(f"SqliteRunStore.open({str(path)!r}, lease_s=1.0)", "run-killed", "k1")
    store = SqliteRunStore.open(path)
    try:
        check_lapsed_run_reads_interrupted(store, "run-killed", "k1")
    finally:
        store.close()


def test_a_live_run_stays_running_long_after_its_first_lease_while_its_host_renews_it(
    tmp_path: Path,
) -> None:
    path = _runs_db(tmp_path)
    lease_s = 4.0
    beginner = SqliteRunStore.open(path, lease_s=lease_s)
    reader = SqliteRunStore.open(path, lease_s=lease_s)

    def lease_until(run_id: str) -> float:
        query = "SELECT lease_until FROM runs WHERE run_id = ?"
        (lease,) = apsw.Connection(str(path)).execute(query, (run_id,)).fetchall()[0]
        assert isinstance(lease, float)
        return lease

    try:
        check_renewed_run_stays_running(beginner, reader, lease_s, lease_until)
    finally:
        beginner.close()
        reader.close()


def test_closing_the_store_marks_its_unfinished_runs_interrupted_and_no_other(
    tmp_path: Path,
) -> None:
    path = _runs_db(tmp_path)
    check_close_interrupts_only_unfinished_runs(lambda: SqliteRunStore.open(path))


def test_the_result_of_a_host_that_stalled_past_its_lease_replaces_the_mark(
    tmp_path: Path,
) -> None:
    path = _runs_db(tmp_path)
    beginner = SqliteRunStore.open(path)
    reader = SqliteRunStore.open(path)

    def lapse(run_id: str) -> None:
        db = apsw.Connection(str(path))
        db.execute("UPDATE runs SET lease_until = 0 WHERE run_id = ?", (run_id,))
        db.close()

    try:
        check_stalled_host_result_replaces_the_mark(beginner, reader, lapse)
    finally:
        beginner.close()
        reader.close()

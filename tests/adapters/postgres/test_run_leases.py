"""Leases on running runs in the PostgreSQL run store (`adapters.run_leases`), on the server's
clock: a run whose host was killed reads as interrupted on every replica once its lease lapses;
a live one never does; a run table of the previous main migrates."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from retrieval_host.adapters.postgres import PgRunStore
from tests.support.run_leases import (
    check_close_interrupts_only_unfinished_runs,
    check_lapsed_run_reads_interrupted,
    check_renewed_run_stays_running,
    check_stalled_host_result_replaces_the_mark,
    killed_mid_run,
)
from tests.support.run_records import pg_run_schema_statements

Opener = Callable[..., PgRunStore]


@pytest.fixture
def run_stores(pg_dsn: str, pg_schema: str) -> Iterator[Opener]:
    opened: list[PgRunStore] = []

    def open_store(lease_s: float = 60.0) -> PgRunStore:
        store = PgRunStore.open(pg_dsn, schema=pg_schema, lease_s=lease_s)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def test_a_run_whose_host_was_killed_reads_as_interrupted_once_its_lease_lapses(
    pg_dsn: str, pg_schema: str, run_stores: Opener
) -> None:
    store = run_stores()  # creates the schema first
    killed_mid_run(
        f"PgRunStore.open({pg_dsn!r}, schema={pg_schema!r}, lease_s=1.0)", "run-killed", "k1"
    )
    check_lapsed_run_reads_interrupted(store, "run-killed", "k1")


def test_a_live_run_stays_running_on_another_replica_while_its_host_renews_it(
    pg_dsn: str, pg_schema: str, run_stores: Opener
) -> None:
    lease_s = 4.0

    def lease_until(run_id: str) -> float:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute(
                f'SELECT lease_until FROM "{pg_schema}".runs WHERE run_id = %s', (run_id,)
            ).fetchone()
        assert row is not None
        return float(row[0])

    check_renewed_run_stays_running(run_stores(lease_s), run_stores(lease_s), lease_s, lease_until)


def test_the_result_of_a_host_that_stalled_past_its_lease_replaces_the_mark(
    pg_dsn: str, pg_schema: str, run_stores: Opener
) -> None:
    beginner, reader = run_stores(), run_stores()

    def lapse(run_id: str) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{pg_schema}".runs SET lease_until = 0 WHERE run_id = %s', (run_id,)
            )

    check_stalled_host_result_replaces_the_mark(beginner, reader, lapse)


def test_closing_the_store_marks_its_unfinished_runs_interrupted_and_no_other(
    run_stores: Opener,
) -> None:
    check_close_interrupts_only_unfinished_runs(run_stores)


def test_a_run_table_of_the_previous_main_gets_leases_for_new_runs_only(
    pg_dsn: str, pg_schema: str, run_stores: Opener
) -> None:
    # The run tables exactly as the previous main created them (schema version 3).
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in pg_run_schema_statements(pg_schema, 3):
            conn.execute(statement)
        conn.execute(
            f'INSERT INTO "{pg_schema}".runs VALUES '
            "('run-old', 'alice', 'k1', 'fp', 'running', 't', NULL, NULL, 'p', NULL)"
        )
    store = run_stores(1.0)
    killed_mid_run(
        f"PgRunStore.open({pg_dsn!r}, schema={pg_schema!r}, lease_s=1.0)", "run-new", "k2"
    )
    check_lapsed_run_reads_interrupted(store, "run-new", "k2")
    old = store.get("run-old")  # a run of the old release, perhaps still going elsewhere
    assert old is not None and (old.status, old.error_code) == ("running", None)
    with psycopg.connect(pg_dsn) as conn:
        version = conn.execute(
            f"SELECT version FROM \"{pg_schema}\".schema_version WHERE component = 'run-store'"
        ).fetchone()
    assert version == (4,)

"""Connections the server ended while they sat idle in the pool (a database restart,
`pg_terminate_backend`) are not lent again: the next request opens a fresh one.

A black-box tester restarted PostgreSQL under two replicas: 30 s after it was back, each
replica's first requests still answered 503 STORE_UNAVAILABLE (`/readyz` unready at the same
moment) and usage records were dropped, one failure per pooled connection. Here the server
ends the pool's connections the way a restart does (a FATAL notice, then the socket closes)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres import PgRunStore, PgVectorStore
from retrieval_host.core.usage import UsageRecord
from tests.support.host import wait_until
from tests.support.sqlite_store import descriptor


def _named(dsn: str) -> tuple[str, str]:
    """The DSN with an application name of its own (to find its connections) and that name."""
    name = f"pool-test-{uuid.uuid4().hex[:12]}"
    return make_conninfo("", **{**conninfo_to_dict(dsn), "application_name": name}), name


def _terminate(dsn: str, name: str) -> Callable[[], int]:
    """End every backend of `name` now; returns a probe of how many are still there."""

    def count() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        return int(row[0]) if row else 0

    with psycopg.connect(dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s) t",
            (name,),
        ).fetchone()
    assert ended is not None and int(ended[0]) >= 1
    return count


def test_the_stores_next_requests_get_fresh_connections(pg_dsn: str, pg_schema: str) -> None:
    dsn, name = _named(pg_dsn)
    store = PgVectorStore.open(dsn, schema=pg_schema, pool_size=2)
    try:
        store.open_corpus(descriptor("c1"))
        assert store.current_revisions("c1", "ns") == {}
        remaining = _terminate(pg_dsn, name)
        wait_until(lambda: remaining() == 0, timeout=30, what="the backends to end")
        for _ in range(3):  # each would have failed once, one per pooled connection
            assert store.current_revisions("c1", "ns") == {}
    finally:
        store.close()


def test_usage_records_after_the_servers_restart_are_written(pg_dsn: str, pg_schema: str) -> None:
    dsn, name = _named(pg_dsn)
    runs = PgRunStore.open(dsn, schema=pg_schema, pool_size=2)
    try:
        record = UsageRecord(
            "2026-01-01T00:00:01.000Z", "alice", "search", "embedding", "p", "a", "m", "d", 1, 3
        )
        runs.record_usage([record])
        assert len(runs.read_usage()) == 1
        remaining = _terminate(pg_dsn, name)
        wait_until(lambda: remaining() == 0, timeout=30, what="the backends to end")
        runs.record_usage([record, record])
        assert len(runs.read_usage()) == 3
    finally:
        runs.close()

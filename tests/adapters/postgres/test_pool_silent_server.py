"""A server that stops answering without closing anything: a request waits a bounded time,
and a closing pool frees the requests still waiting on it.

A black-box tester froze PostgreSQL (SIGSTOP: the kernel still acknowledges, so neither TCP
nor the server's own `statement_timeout` ends anything): a search hung for the whole outage,
its slot taken, and the host outlived SIGTERM until the database came back. Here one backend
is frozen the same way (its process stopped) or kept busy (`pg_sleep`)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.postgres.pool import ConnectionPool, answer_timeout_s, unbounded
from retrieval_host.core.errors import ErrorCode, RetrievalError
from tests.support.sqlite_store import descriptor

BOUND_S = 1.0


def _pool(dsn: str, size: int = 1, bound: float | None = BOUND_S) -> ConnectionPool:
    return ConnectionPool(dsn, size, lambda conn: None, answer_timeout_s=bound)


def test_an_operation_on_a_frozen_backend_fails_after_the_bound(pg_dsn: str) -> None:
    pool = _pool(pg_dsn)
    try:
        with pool.connection() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backend = int(row[0])
            os.kill(backend, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(psycopg.OperationalError, match="did not answer within 1 s"):
                    conn.execute("SELECT 1")
                elapsed = time.monotonic() - started
            finally:
                os.kill(backend, signal.SIGCONT)
            assert BOUND_S <= elapsed < BOUND_S + 10
            assert conn.closed  # abandoned: the pool will not lend it again
        with pool.connection() as fresh:  # a new connection serves
            assert fresh.execute("SELECT 2").fetchone() == (2,)
    finally:
        pool.close()


def test_a_slow_answer_within_the_bound_or_unbounded_is_waited_for(pg_dsn: str) -> None:
    pool = _pool(pg_dsn, bound=0.5)
    try:
        with pool.connection() as conn:
            assert conn.execute("SELECT pg_sleep(0.1), 3").fetchone() == ("", 3)
            with unbounded(conn):  # an index build's minutes
                assert conn.execute("SELECT pg_sleep(1.0), 4").fetchone() == ("", 4)
            with pytest.raises(psycopg.OperationalError, match="did not answer"):
                conn.execute("SELECT pg_sleep(1.0)")
    finally:
        pool.close()


def test_closing_the_pool_frees_a_request_waiting_on_the_server(pg_dsn: str) -> None:
    pool = _pool(pg_dsn, bound=None)  # no bound at all: only the close can free it
    waiting = threading.Event()
    outcome: list[BaseException | None] = []

    def request() -> None:
        try:
            with pool.connection() as conn:
                waiting.set()
                conn.execute("SELECT pg_sleep(30)")
            outcome.append(None)
        except BaseException as exc:  # the outcome is what the test checks
            outcome.append(exc)

    worker = threading.Thread(target=request, daemon=True)
    worker.start()
    assert waiting.wait(timeout=30)
    started = time.monotonic()
    pool.close()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the waiting request was not freed"
    assert time.monotonic() - started < 20
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.OperationalError)


def test_a_store_reports_a_silent_server_as_unavailable(pg_dsn: str, pg_schema: str) -> None:
    name = f"silent-{uuid.uuid4().hex[:12]}"
    dsn = make_conninfo("", **{**conninfo_to_dict(pg_dsn), "application_name": name})
    store = PgVectorStore.open(dsn, schema=pg_schema, pool_size=1, statement_timeout_ms=500)
    assert answer_timeout_s(500) == 5.5
    try:
        store.open_corpus(descriptor("c1"))
        assert store.current_revisions("c1", "ns") == {}
        backends: list[int] = []
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ):
                backends.append(int(pid))
        assert backends
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(RetrievalError) as info:
                store.current_revisions("c1", "ns")
            elapsed = time.monotonic() - started
        finally:
            for pid in backends:
                os.kill(pid, signal.SIGCONT)
        assert (info.value.code, info.value.reason) == (ErrorCode.STORE_UNAVAILABLE, "connection")
        assert elapsed < 5.5 + 10
        assert store.current_revisions("c1", "ns") == {}  # a fresh connection serves
    finally:
        store.close()


def test_a_wrong_password_is_told_apart_from_a_database_that_is_down(pg_dsn: str) -> None:
    # A black-box test: a rotated password read "the database connection failed", as an outage.
    wrong = make_conninfo("", **{**conninfo_to_dict(pg_dsn), "password": "not-the-password"})
    pool = ConnectionPool(wrong, 1, lambda conn: None)
    try:
        with pytest.raises(RetrievalError) as info, pool.connection():
            pass
    finally:
        pool.close()
    assert (info.value.code, info.value.reason) == (ErrorCode.STORE_UNAVAILABLE, "authentication")
    assert "refused the credentials" in info.value.detail
    assert "not-the-password" not in info.value.detail

"""A server with no connection slot left for a new session (other replicas' pools hold them)
is waited out while the pool holds connections of its own: a probe's 8 concurrent searches
got 7 x 503 `connection` in under a second from a host whose two connections came free within
milliseconds. With none of its own to wait for, the refusal is `BUSY`, said as what it is.

A role's connection limit stands in for `max_connections` here: PostgreSQL refuses both the
same way (a FATAL message and no SQLSTATE for libpq's caller)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres.pool import Connection, ConnectionPool
from retrieval_host.core.errors import ErrorCode, RetrievalError
from tests.support.host import wait_until
from tests.support.pg import connect

LIMIT = 2


@pytest.fixture
def limited_dsn(pg_dsn: str) -> Iterator[str]:
    """The DSN of a role that may hold at most `LIMIT` sessions."""
    role = f"rh_slots_{uuid.uuid4().hex[:10]}"
    with connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'slots' CONNECTION LIMIT {}").format(
                sql.Identifier(role), sql.Literal(LIMIT)
            )
        )
    params = conninfo_to_dict(pg_dsn)
    params.update(user=role, password="slots")
    try:
        yield make_conninfo("", **params)
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _setup(conn: Connection) -> None:
    conn.execute("SELECT 1")


def test_a_server_out_of_slots_is_waited_out_while_the_pool_holds_connections(
    limited_dsn: str,
) -> None:
    pool = ConnectionPool(limited_dsn, LIMIT + 2, _setup, acquire_timeout_s=30.0)
    try:
        with pool.connection(), pool.connection():  # every slot the role has
            got: list[object] = []
            asking = threading.Event()

            def third() -> None:
                asking.set()
                try:
                    with pool.connection() as conn:
                        got.append(conn.execute("SELECT 42").fetchone())
                except RetrievalError as error:
                    got.append(error)

            thread = threading.Thread(target=third)
            thread.start()
            asking.wait(timeout=30)
            # Refused by the server, it now waits for one of the two held above.
            wait_until(lambda: pool._no_slot_until > 0, what="the refused connection")
            assert thread.is_alive() and got == []
        thread.join(timeout=30)
        assert got == [(42,)]
    finally:
        pool.close()


def test_a_server_out_of_slots_with_nothing_to_wait_for_is_busy(limited_dsn: str) -> None:
    others = [psycopg.connect(limited_dsn) for _ in range(LIMIT)]  # another replica's pool
    pool = ConnectionPool(limited_dsn, 4, _setup)
    try:
        with pytest.raises(RetrievalError) as refused, pool.connection():
            pass
        assert (refused.value.code, refused.value.reason) == (ErrorCode.STORE_UNAVAILABLE, "busy")
        assert "no connection slot" in refused.value.detail
    finally:
        pool.close()
        for conn in others:
            conn.close()

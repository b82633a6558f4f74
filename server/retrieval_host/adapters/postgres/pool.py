"""PostgreSQL connections: a small pool, transactions on autocommit connections, advisory lock
keys, and the translation of driver errors into the codes and reasons both stores share.

A connection carries session settings (search path, timeouts, type adapters), so the pool needs
session-level connections (direct, or a session-pooling proxy, not transaction pooling). A
broken connection is dropped; nothing is retried automatically. An idle connection that the
server has ended (a restart, `pg_terminate_backend`: the server says so and closes it, so its
socket turns readable while nothing was asked) is dropped when it would be lent, and another
one is lent instead: after a database restart, requests that arrive once it is back do not
fail on the connections the restart ended (a black-box tester saw every replica's first
requests answer 503, and usage records dropped, 30 s after the database was back).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters._store_rules import (
    busy,
    chunk_id_taken,
    closed,
    concurrent_writer,
    translating,
)
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason

__all__ = ["Connection", "ConnectionPool", "lock_key", "store_error", "transaction", "translated"]

Connection = psycopg.Connection[tuple[Any, ...]]


def store_error(action: str, exc: psycopg.Error) -> RetrievalError:
    # The server's message is not rendered to callers (it may quote values); it stays attached
    # as the cause for the log.
    if isinstance(exc, pg_errors.UniqueViolation):
        constraint = exc.diag.constraint_name or ""
        if constraint.startswith("chunks_chunk_id"):
            return chunk_id_taken()
        if constraint.startswith("sources_source"):
            return concurrent_writer()
    if isinstance(exc, pg_errors.DeadlockDetected | pg_errors.SerializationFailure):
        return concurrent_writer()
    if isinstance(exc, pg_errors.LockNotAvailable):
        return busy(action)
    if isinstance(exc, pg_errors.QueryCanceled):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database statement timeout passed while {action}.",
            reason=StoreUnavailableReason.STATEMENT_TIMEOUT,
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database connection failed while {action}.",
            reason=StoreUnavailableReason.CONNECTION,
        )
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"the database failed while {action}.",
        reason=StoreUnavailableReason.DATABASE_ERROR,
    )


def translated(action: str) -> contextlib.AbstractContextManager[None]:
    """Turn driver errors raised in the block into `RetrievalError`s (ours pass through)."""
    return translating(psycopg.Error, store_error, action)


class ConnectionPool:
    """A small thread-safe pool of autocommit connections, opened lazily up to `size`.

    `setup` runs once on each new connection (session settings, type adapters). A connection
    that comes back broken, or in a transaction, is closed instead of reused.
    """

    def __init__(
        self,
        dsn: str,
        size: int,
        setup: Callable[[Connection], None],
        *,
        acquire_timeout_s: float = 30.0,
    ) -> None:
        if isinstance(size, bool) or size < 1:
            raise ValueError("pool_size must be a positive integer")
        conninfo: str | None = None
        try:
            params = conninfo_to_dict(dsn)
            params.setdefault("application_name", "retrieval-host")
            params.setdefault("connect_timeout", 10)
            conninfo = make_conninfo("", **params)
        except psycopg.Error:
            pass  # raised below, outside this block, so it carries no `__context__`
        if conninfo is None:
            # libpq's message quotes the connection string, password and all (`missing "="
            # after "postgresql//user:PASSWORD@..."`: one `:` left out): neither it nor the
            # exception holding it may reach a log or a traceback, even as a context.
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "store.postgresDsn is not a PostgreSQL connection string "
                "(postgresql://USER@HOST:PORT/DATABASE, or key=value pairs); it is not shown, "
                "as it may hold a password.",
                reason=StoreUnavailableReason.CONNECTION,
            )
        self._conninfo = conninfo
        self._size = size
        self._setup = setup
        self._timeout = acquire_timeout_s
        self._idle: list[Connection] = []
        self._open = 0
        self._closed = False
        self._cond = threading.Condition()

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        """Borrow a connection for the block (`STORE_UNAVAILABLE` if none can be had)."""
        conn = self._acquire()
        try:
            yield conn
        finally:
            self._release(conn)

    def close(self) -> None:
        """Close idle connections now and borrowed ones when they come back. Idempotent."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    def _acquire(self) -> Connection:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                if self._closed:
                    raise closed()
                while self._idle:
                    idle = self._idle.pop()
                    if not _ended(idle):
                        return idle
                    self._open -= 1
                    idle.close()  # no I/O to speak of: the server already closed its side
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "no database connection became free in time.",
                        reason=StoreUnavailableReason.BUSY,
                    )
                self._cond.wait(left)
        try:
            with translated("connecting to the database"):
                conn: Connection = psycopg.connect(self._conninfo, autocommit=True)
                try:
                    self._setup(conn)
                except BaseException:
                    conn.close()
                    raise
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise
        return conn

    def _release(self, conn: Connection) -> None:
        keep = not conn.closed and not conn.broken
        if keep and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            keep = False  # an interrupted block: its session state is unknown
        with self._cond:
            if keep and not self._closed:
                self._idle.append(conn)
            else:
                self._open -= 1
                keep = False
            self._cond.notify()
        if not keep:
            conn.close()


def _ended(conn: Connection) -> bool:
    """Whether an idle connection can no longer serve: closed, broken, or with something to
    read although nothing was asked (the server's goodbye before it closed the socket)."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def transaction(
    conn: Connection, *, repeatable_read: bool = False, read_only: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """A transaction block on an autocommit connection with the given characteristics."""
    conn.isolation_level = (
        psycopg.IsolationLevel.REPEATABLE_READ
        if repeatable_read
        else psycopg.IsolationLevel.READ_COMMITTED
    )
    conn.read_only = read_only
    return conn.transaction()


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for the parts (collisions only serialise more)."""
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)

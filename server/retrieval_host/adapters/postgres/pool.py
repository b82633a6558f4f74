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

A server that stops answering without closing anything (a frozen process, a partition that
drops packets: the kernel still acknowledges) is not caught by its own `statement_timeout`,
so each operation also waits at most `answer_timeout_s` for the server (`_Connection`; the
stores give their statement timeout plus 5 s); past it the connection is abandoned and the
operation fails `STORE_UNAVAILABLE` (`connection`). Closing the pool shuts the sockets of the
connections still lent, so a shutdown is not held by a request waiting on such a server (a
black-box tester's host outlived SIGTERM by as long as the database was frozen).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.abc import PQGen
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

__all__ = [
    "Connection",
    "ConnectionPool",
    "answer_timeout_s",
    "lock_key",
    "store_error",
    "transaction",
    "translated",
    "unbounded",
]

RV = TypeVar("RV")
# SQLSTATE class 28: invalid authorization specification, invalid password.
_AUTHENTICATION_STATES: Final = frozenset({"28000", "28P01"})
# SQLSTATE class 54: program limit exceeded (an index row too large, a statement too complex,
# too many columns or arguments).
_LIMIT_CLASS: Final = "54"
ANSWER_GRACE_S: Final = 5.0
# How often a wait wakes to let signals in (psycopg's own default).
_WAIT_INTERVAL_S: Final = 0.1
# What PostgreSQL says when it has no connection slot for a new session (max_connections, the
# reserved slots, a role's or database's limit). libpq gives a refused connection no SQLSTATE.
_NO_SLOT: Final = (
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
)
# How long a pool refused a connection for want of a slot waits for its own lent connections
# before it asks the server for a new one again.
_NO_SLOT_RETRY_S: Final = 1.0

Connection = psycopg.Connection[tuple[Any, ...]]


class _Connection(psycopg.Connection[tuple[Any, ...]]):
    """A connection whose every operation waits at most `answer_timeout_s` for the server
    (None: as long as it takes); past it the connection is closed and the operation raises
    `OperationalError`, which the stores report as `STORE_UNAVAILABLE`."""

    answer_timeout_s: float | None = None

    def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None
    ) -> RV:
        bound = self.answer_timeout_s
        if bound is None or (timeout is not None and timeout <= bound):
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return super().wait(gen, interval, bound)
        except psycopg.OperationalError as exc:
            if time.monotonic() - started < bound:
                raise
            self.pgconn.finish()  # mid-operation: nothing more can be done with it
            raise psycopg.OperationalError(
                f"the database did not answer within {bound:g} s"
            ) from exc


def answer_timeout_s(statement_timeout_ms: int) -> float:
    """How long an operation waits for the server: its statement timeout and 5 s more (the
    server's own timeout answers first whenever the server answers at all)."""
    return statement_timeout_ms / 1000 + ANSWER_GRACE_S


@contextlib.contextmanager
def unbounded(conn: Connection) -> Iterator[None]:
    """No bound on the server's answers in the block: an operation that may rightly take
    minutes (an HNSW index build, run with `statement_timeout` 0)."""
    if not isinstance(conn, _Connection):
        yield
        return
    previous, conn.answer_timeout_s = conn.answer_timeout_s, None
    try:
        yield
    finally:
        conn.answer_timeout_s = previous


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
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        # A hot standby (or a role whose sessions default to read-only): said as such, not as
        # a database failure (a writable store opened on a standby; task F2, session 37).
        return RetrievalError(
            ErrorCode.STORE_READ_ONLY,
            f"the database takes no writes (a hot standby, or read-only sessions) while "
            f"{action}: serve it with store.readOnly: true (run records then need "
            "runs.sqlitePath), or point store.postgresDsn at the primary.",
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database statement timeout passed while {action}.",
            reason=StoreUnavailableReason.STATEMENT_TIMEOUT,
        )
    if (exc.sqlstate or "").startswith(_LIMIT_CLASS):
        # psycopg raises class 54 as an OperationalError, which read as a failed connection:
        # a client retried in vain a source the database refuses every time (an index row over
        # the btree's 2,704 bytes, probe "parity", session 44). The same request fails alike.
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"a database limit was exceeded while {action}; the same request fails again.",
            reason=StoreUnavailableReason.DATABASE_ERROR,
        )
    if isinstance(exc, psycopg.OperationalError) and (
        exc.sqlstate in _AUTHENTICATION_STATES or "authentication failed" in str(exc)
    ):
        # Told apart from an outage (a rotated password looked like a database that is down,
        # a black-box test); the server's text is not quoted (it names the role).
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database refused the credentials (authentication failed) while {action}.",
            reason=StoreUnavailableReason.AUTHENTICATION,
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
        answer_timeout_s: float | None = None,
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
        self._answer_timeout = answer_timeout_s
        self._idle: list[Connection] = []
        self._lent: set[Connection] = set()
        self._open = 0
        # Until then, a pool the server refused a connection for want of slots opens none.
        self._no_slot_until = 0.0
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
        """Close idle connections now and borrowed ones when they come back; an operation
        still waiting on the server fails at once (its socket is shut). Idempotent."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            # Under the lock: a lent connection is taken out of `_lent` under it before it is
            # closed, so its descriptor is still its own here (not reused by another socket).
            for conn in self._lent:
                _shut(conn)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    def _acquire(self) -> Connection:
        """An idle connection, a new one while fewer than `size` are open, or the first one
        returned within the acquire timeout (`BUSY` after it). A server out of connection
        slots (other replicas' pools hold them) refusing a new one is waited out the same way
        while this pool holds others: a probe's searches failed at once although the host's
        own connections came free within milliseconds."""
        deadline = time.monotonic() + self._timeout
        while True:
            conn = self._lend_or_reserve(deadline)
            if conn is not None:
                return conn
            try:
                return self._connect()
            except _NoSlot:
                continue  # wait for a connection this pool lent

    def _lend_or_reserve(self, deadline: float) -> Connection | None:
        """An idle connection, or None with a slot reserved for a new one (`_open` counts
        it): wait for either until `deadline`."""
        with self._cond:
            while True:
                if self._closed:
                    raise closed()
                while self._idle:
                    idle = self._idle.pop()
                    if not _ended(idle):
                        self._lent.add(idle)
                        return idle
                    self._open -= 1
                    idle.close()  # no I/O to speak of: the server already closed its side
                waiting = self._open > 0 and time.monotonic() < self._no_slot_until
                if self._open < self._size and not waiting:
                    self._open += 1
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "no database connection became free in time.",
                        reason=StoreUnavailableReason.BUSY,
                    )
                self._cond.wait(min(left, _NO_SLOT_RETRY_S) if waiting else left)

    def _connect(self) -> Connection:
        """A new connection, set up, in the slot `_lend_or_reserve` reserved."""
        try:
            with translated("connecting to the database"):
                try:
                    bounded = _Connection.connect(self._conninfo, autocommit=True)
                except psycopg.OperationalError as exc:
                    if any(words in str(exc) for words in _NO_SLOT):
                        raise _NoSlot from None
                    raise
                bounded.answer_timeout_s = self._answer_timeout
                conn: Connection = bounded
                with self._cond:  # lent from here: a close shuts it even during `setup`
                    self._lent.add(conn)
                    if self._closed:
                        _shut(conn)
                try:
                    self._setup(conn)
                except BaseException:
                    with self._cond:
                        self._lent.discard(conn)
                    conn.close()
                    raise
        except _NoSlot:
            with self._cond:
                self._open -= 1
                self._cond.notify()
                if self._open > 0:
                    self._no_slot_until = time.monotonic() + _NO_SLOT_RETRY_S
                    raise
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "the database has no connection slot free for this host (its max_connections "
                "or a role's or database's connection limit, taken by other clients).",
                reason=StoreUnavailableReason.BUSY,
            ) from None
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
            self._lent.discard(conn)
            if keep and not self._closed:
                self._idle.append(conn)
            else:
                self._open -= 1
                keep = False
            self._cond.notify()
        if not keep:
            conn.close()


class _NoSlot(Exception):
    """The server refused a new connection for want of a slot."""


def _shut(conn: Connection) -> None:
    """Shut a lent connection's socket: a thread waiting on it wakes with an error."""
    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


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
    """A transaction block on an autocommit connection with the given characteristics.

    `read_only` can only narrow: without it the block keeps the session's access mode, so a
    read-only store's sessions (`default_transaction_read_only`, `schema.session_setup`) cannot
    write whatever the block does. Forcing READ WRITE here let a read-only store create and
    migrate its schema (a black-box probe)."""
    conn.isolation_level = (
        psycopg.IsolationLevel.REPEATABLE_READ
        if repeatable_read
        else psycopg.IsolationLevel.READ_COMMITTED
    )
    conn.read_only = True if read_only else None  # None: the session's default
    return conn.transaction()


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for the parts (collisions only serialise more)."""
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)

"""The PostgreSQL + pgvector vector store (SPEC §3.7): several host replicas share one database.

Same contract, errors and reasons as the SQLite store (`core.ports.VectorStore`); what differs is
where the work happens and what makes it safe across processes.

Layout. Tables live in one dedicated PostgreSQL schema (default `retrieval_host`): `corpora`
(descriptor, dimensions, payload total), `sources` (one row per current revision), `chunks`
(text, location and an untyped `vector` column, so corpora of different dimensions share the
table) and `schema_version` (one row per component: `vector-store` here, `run-store` for
`run_store_pg`). The adapter creates them on first use under an advisory lock and refuses a
schema whose tables exist without our version row, with another version, or another shape
(`UNSAFE_STORE`, reasons `unrelated-database` / `schema-version`, as SQLite). The `vector`
extension is created if missing (that needs the privilege; otherwise a DBA creates it once).
SQL is static text plus bound values; the only composed parts are the schema identifier (checked
against `[a-z_][a-z0-9_]*`, then quoted) and, for the HNSW index, the corpus dimension (an
integer from the descriptor).

Writes. `replace_source` runs in one READ COMMITTED transaction: an advisory transaction lock
keyed by (schema, corpus, namespace, source id) serialises writers of one source across every
replica, then the current row is read (a fresh snapshot, so a racing winner's commit is seen),
`expected_revision` compared (`SOURCE_CONFLICT`, reason `concurrent-writer`), chunk ids checked,
the old revision deleted (chunks cascade), the new one inserted with binary COPY, and the
corpus payload total updated with a conditional UPDATE that is the authoritative capacity check
(`CAPACITY_EXCEEDED`), so two writers of different sources cannot both pass the limit. Readers
never see a partial revision: PostgreSQL makes the transaction visible at once on commit. A
chunk-id race between two sources surfaces as the unique constraint (`CHUNK_ID_CONFLICT`);
chunks are inserted in chunk-id order so such races cannot deadlock each other.

Search. One REPEATABLE READ, READ ONLY transaction (one snapshot for every step): the allowed
`(source, revision)` pairs are matched in SQL against `sources` inside the corpus and namespace,
with the metadata filters (JSON equality via `jsonb`), before anything is ranked. Then:

- exact (the default): the allowed rows are scored in SQL by cosine distance in batches of
  `scan_batch_rows` rows (each batch returns only its best `k`), checking the cancel token
  before each batch, as the SQLite store does;
- HNSW (`hnsw=True`): when at least `hnsw_min_rows` rows are allowed, one index scan on a
  partial expression index `((embedding::vector(D)) vector_cosine_ops) WHERE dimensions = D`
  with `hnsw.ef_search` and, on pgvector >= 0.8, `hnsw.iterative_scan = relaxed_order`, so the
  filter does not starve the result. If the index still returns fewer than `min(k, allowed
  rows)` (pgvector stops at `hnsw.max_scan_tuples`), the exact scan answers instead. Smaller
  grants use the exact scan directly: it is exact and as fast there.

Final scores are computed in NumPy from the returned vectors exactly as the SQLite store does
(float32 unit vectors), which also restores strict order after a relaxed-order index scan.

Cancellation. The token is checked before each batch (or before the index scan); a statement in
flight is bounded by `statement_timeout_ms` (session setting), not interrupted by the token.

Deletion. `reclamation` is `pending`: PostgreSQL removes dead tuples at VACUUM (autovacuum)
and the bytes stay in the data files and WAL until reused; nothing is overwritten at delete.

Connections. A small internal pool (`pool_size`) of autocommit connections; each carries a
session `search_path` naming the extension's schema, the pgvector type adapters and the
timeouts, so it needs a session-level connection (direct or a session-pooling proxy, not
transaction pooling). A broken connection is dropped; nothing is retried automatically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import psycopg
from pgvector.psycopg import register_vector
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters._rows import stored_source, unit_rows
from retrieval_host.adapters.store_sqlite import StoreCounters
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.models import JSONScalar, Location
from retrieval_host.core.ports import (
    Candidate,
    CapacityLimits,
    StoredChunk,
    StoredSource,
    Vectors,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "Connection",
    "ConnectionPool",
    "PgSearchStats",
    "PgVectorStore",
    "StoreCounters",
    "check_schema_name",
    "ensure_schema_component",
    "translated",
]

SCHEMA_VERSION: Final = 1
COMPONENT: Final = "vector-store"
DEFAULT_SCHEMA: Final = "retrieval_host"
MIN_PGVECTOR_HNSW: Final = (0, 5, 0)
MIN_PGVECTOR_ITERATIVE: Final = (0, 8, 0)
HNSW_MAX_DIMENSIONS: Final = 2000  # pgvector's limit for an HNSW index on `vector`
HNSW_BUILD_MEMORY: Final = "512MB"
HNSW_BUILD_WAIT_S: Final = 3600.0  # how long a replica waits for another one's index build
_SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

Connection = psycopg.Connection[tuple[Any, ...]]

# Search statements run with `prepare=False`: psycopg prepares a statement after a few
# executions, and PostgreSQL may then switch to a generic plan that cannot see the grant (the
# arrays of sources) and picks a poor path. Planning them costs well under a millisecond.

_log = logging.getLogger(__name__)

_Matrix = npt.NDArray[np.float32]

# Expected shape of our tables (column -> udt name); anything else is not ours.
_VECTOR_TABLES: Final[Mapping[str, Mapping[str, str]]] = {
    "corpora": {
        "corpus_id": "text",
        "descriptor_json": "text",
        "dimensions": "int4",
        "payload_bytes": "int8",
    },
    "sources": {
        "id": "int8",
        "corpus_id": "text",
        "namespace": "text",
        "source_id": "text",
        "revision": "text",
        "title": "text",
        "metadata_json": "text",
        "metadata": "jsonb",
        "document_sha256": "text",
        "fingerprint": "text",
        "chunk_count": "int8",
        "payload_bytes": "int8",
    },
    "chunks": {
        "id": "int8",
        "source_pk": "int8",
        "corpus_id": "text",
        "namespace": "text",
        "chunk_id": "text",
        "ordinal": "int8",
        "text": "text",
        "page": "int8",
        "start_line": "int8",
        "end_line": "int8",
        "document_id": "text",
        "dimensions": "int4",
        "embedding": "vector",
    },
}

_VECTOR_DDL: Final = (
    """CREATE TABLE {s}.corpora (
        corpus_id text PRIMARY KEY,
        descriptor_json text NOT NULL,
        dimensions integer NOT NULL CHECK (dimensions BETWEEN 1 AND 16384),
        payload_bytes bigint NOT NULL DEFAULT 0 CHECK (payload_bytes >= 0)
    )""",
    """CREATE TABLE {s}.sources (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        corpus_id text NOT NULL REFERENCES {s}.corpora (corpus_id),
        namespace text NOT NULL,
        source_id text NOT NULL,
        revision text NOT NULL,
        title text NOT NULL,
        metadata_json text NOT NULL,
        metadata jsonb NOT NULL,
        document_sha256 text NOT NULL,
        fingerprint text NOT NULL,
        chunk_count bigint NOT NULL,
        payload_bytes bigint NOT NULL,
        CONSTRAINT sources_source_key UNIQUE (corpus_id, namespace, source_id)
    )""",
    """CREATE TABLE {s}.chunks (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        source_pk bigint NOT NULL REFERENCES {s}.sources (id) ON DELETE CASCADE,
        corpus_id text NOT NULL,
        namespace text NOT NULL,
        chunk_id text NOT NULL,
        ordinal bigint NOT NULL,
        text text NOT NULL,
        page bigint,
        start_line bigint,
        end_line bigint,
        document_id text,
        dimensions integer NOT NULL,
        embedding vector NOT NULL CHECK (vector_dims(embedding) = dimensions),
        CONSTRAINT chunks_chunk_id_key UNIQUE (corpus_id, namespace, chunk_id),
        CONSTRAINT chunks_ordinal_key UNIQUE (source_pk, ordinal)
    )""",
)

# Binary COPY column types of `chunks`, in the order `replace_source` writes them.
_COPY_TYPES: Final = "int8 text text text int8 text int8 int8 int8 text int4 vector".split()

_VERSION_TABLE: Final[Mapping[str, str]] = {"component": "text", "version": "int4"}


@dataclass(frozen=True, slots=True)
class PgSearchStats:
    """Which path searches took (a snapshot): index scans, and exact fallbacks after them."""

    index_scans: int = 0
    exact_fallbacks: int = 0


# --- errors ---------------------------------------------------------------------------------


def _store_error(action: str, exc: psycopg.Error) -> RetrievalError:
    # The server's message is not rendered to callers (it may quote values); it stays attached
    # as the cause for the log.
    if isinstance(exc, pg_errors.UniqueViolation):
        constraint = exc.diag.constraint_name or ""
        if constraint.startswith("chunks_chunk_id"):
            return RetrievalError(
                ErrorCode.CHUNK_ID_CONFLICT,
                "a chunk id of this revision is already used by another source in this namespace.",
            )
        if constraint.startswith("sources_source"):
            return _concurrent_writer()
    if isinstance(exc, pg_errors.DeadlockDetected | pg_errors.SerializationFailure):
        return _concurrent_writer()
    if isinstance(exc, pg_errors.LockNotAvailable):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database stayed locked by another writer while {action}.",
            reason="busy",
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database statement timeout passed while {action}.",
            reason="statement-timeout",
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database connection failed while {action}.",
            reason="connection",
        )
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"the database failed while {action}.",
        reason="database-error",
    )


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn driver errors raised in the block into `RetrievalError`s (ours pass through)."""
    try:
        yield
    except psycopg.Error as exc:
        raise _store_error(action, exc) from exc


def _concurrent_writer() -> RetrievalError:
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT,
        "another writer changed this source first; read it again and retry if the change "
        "still applies.",
        reason="concurrent-writer",
    )


def _closed() -> RetrievalError:
    return RetrievalError(ErrorCode.STORE_UNAVAILABLE, "the store is closed.", reason="closed")


def _unsafe(detail: str, reason: str) -> RetrievalError:
    return RetrievalError(ErrorCode.UNSAFE_STORE, detail, reason=reason)


# --- connections ----------------------------------------------------------------------------


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
        params = conninfo_to_dict(dsn)
        params.setdefault("application_name", "retrieval-host")
        params.setdefault("connect_timeout", 10)
        self._conninfo = make_conninfo("", **params)
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
                    raise _closed()
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "no database connection became free in time.",
                        reason="busy",
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


def _transaction(
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


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for the parts (collisions only serialise more)."""
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _schema_sql(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


def check_schema_name(schema: str) -> str:
    """Accept a lowercase SQL identifier (it is quoted anyway; this keeps it unsurprising)."""
    if not _SCHEMA_NAME.match(schema):
        raise ValueError("schema must match [a-z_][a-z0-9_]{0,62}")
    return schema


def ensure_schema_component(
    conn: Connection,
    schema: str,
    component: str,
    version: int,
    tables: Mapping[str, Mapping[str, str]],
    ddl: Sequence[str],
    migrations: Mapping[int, Sequence[str]] | None = None,
) -> None:
    """Create `component`'s tables in `schema` on first use, or check they are ours.

    Runs in one transaction under an advisory lock, so replicas starting together create the
    schema once. `migrations[v]` holds the statements that bring version v to v + 1: a schema
    an earlier release wrote is upgraded in that same transaction. Refuses (`UNSAFE_STORE`) a
    schema holding tables without our version table, our table names without our version row,
    a version it cannot reach, or another table shape.
    """
    with translated("preparing the schema"), _transaction(conn):
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s)", (_lock_key("retrieval-host-schema", schema),)
        )
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if exists is None:
            conn.execute(_schema_sql(schema, "CREATE SCHEMA {s}"))
        present = {
            str(r[0])
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                (schema,),
            )
        }
        stored: int | None = None
        if "schema_version" not in present:
            if present:
                raise _unsafe(
                    f"schema {schema!r} holds tables of another application; point the store "
                    "at its own schema.",
                    "unrelated-database",
                )
            conn.execute(
                _schema_sql(
                    schema,
                    "CREATE TABLE {s}.schema_version "
                    "(component text PRIMARY KEY, version integer NOT NULL)",
                )
            )
        else:
            _check_shape(conn, schema, {"schema_version": _VERSION_TABLE})
            row = conn.execute(
                _schema_sql(schema, "SELECT version FROM {s}.schema_version WHERE component = %s"),
                (component,),
            ).fetchone()
            stored = None if row is None else int(row[0])
        if stored is None:
            if present & set(tables):
                raise _unsafe(
                    f"schema {schema!r} holds tables named like ours without our version "
                    "record; it was not written by this host.",
                    "unrelated-database",
                )
            for statement in ddl:
                conn.execute(_schema_sql(schema, statement))
            conn.execute(
                _schema_sql(
                    schema, "INSERT INTO {s}.schema_version (component, version) VALUES (%s, %s)"
                ),
                (component, version),
            )
        else:
            steps = migrations or {}
            if stored > version or any(v not in steps for v in range(stored, version)):
                raise _unsafe(
                    f"the {component} schema has version {stored}; this host reads version "
                    f"{version}.",
                    "schema-version",
                )
            for step in range(stored, version):
                for statement in steps[step]:
                    conn.execute(_schema_sql(schema, statement))
            if stored != version:
                conn.execute(
                    _schema_sql(
                        schema, "UPDATE {s}.schema_version SET version = %s WHERE component = %s"
                    ),
                    (version, component),
                )
            _check_shape(conn, schema, tables)


def _check_shape(conn: Connection, schema: str, tables: Mapping[str, Mapping[str, str]]) -> None:
    found: dict[str, dict[str, str]] = {}
    for table, column, udt in conn.execute(
        "SELECT table_name, column_name, udt_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = ANY(%s)",
        (schema, list(tables)),
    ):
        found.setdefault(str(table), {})[str(column)] = str(udt)
    if found != {name: dict(columns) for name, columns in tables.items()}:
        raise _unsafe(
            f"the tables in schema {schema!r} do not have the shape this host writes; they "
            "were not written by it.",
            "unrelated-database",
        )


def _extension(conn: Connection) -> tuple[str, tuple[int, ...]] | None:
    row = conn.execute(
        "SELECT n.nspname, e.extversion FROM pg_extension e "
        "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None:
        return None
    version = tuple(int(p) for p in re.findall(r"\d+", str(row[1]))[:3])
    return str(row[0]), version


def _ensure_extension(conn: Connection) -> tuple[str, tuple[int, ...]]:
    """The schema and version of the `vector` extension, creating it when allowed."""
    found = _extension(conn)
    if found is not None:
        return found
    try:
        with _transaction(conn):
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s)", (_lock_key("retrieval-host-extension"),)
            )
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the pgvector extension is not installed in this database and this role may not "
            "create it; run CREATE EXTENSION vector once as an administrator.",
            reason="pgvector-missing",
        ) from exc
    found = _extension(conn)
    if found is None:  # pragma: no cover - CREATE EXTENSION succeeded
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE, "pgvector is not available.", reason="pgvector-missing"
        )
    return found


# --- vectors and values ---------------------------------------------------------------------


def _stack(dims: int, vectors: Sequence[Vectors], what: str) -> _Matrix:
    if not vectors:
        return np.empty((0, dims), dtype=np.float32)
    arrays = [np.asarray(v) for v in vectors]
    if any(a.shape != (dims,) for a in arrays):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"{what} must have shape ({dims},), the corpus dimensions.",
            reason="vector-shape",
        )
    # np.stack copies: the caller's arrays are never written to.
    return np.stack(arrays).astype(np.float32, copy=False)


def _reject_nul(values: Sequence[str | None]) -> None:
    # PostgreSQL text and jsonb cannot hold U+0000; refuse rather than alter the content.
    if any(v is not None and "\x00" in v for v in values):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "text stored in PostgreSQL must not contain the NUL character (U+0000).",
            reason="nul-character",
        )


@dataclass(frozen=True, slots=True)
class _Scored:
    pk: int
    source_pk: int
    ordinal: int
    vector: _Matrix


# --- the store ------------------------------------------------------------------------------


class PgVectorStore:
    """The scale-out vector store (implements `core.ports.VectorStore`); create with `open()`.

    Thread-safe: every call borrows a pooled connection. Any number of instances, in any
    number of processes, may share one database schema.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        schema: str,
        *,
        hnsw: bool,
        iterative_scan: bool,
        ef_search: int,
        hnsw_min_rows: int,
        scan_batch_rows: int,
    ) -> None:
        """Private: use `PgVectorStore.open(dsn)`, which prepares the schema."""
        self._pool = pool
        self._schema = schema
        self._hnsw = hnsw
        self._iterative = iterative_scan
        self._ef_search = ef_search
        self._hnsw_min_rows = hnsw_min_rows
        self._batch = scan_batch_rows
        self._lock = threading.Lock()
        self._corpora: dict[str, CorpusDescriptor] = {}
        self._counters = StoreCounters()
        self._stats = PgSearchStats()

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        hnsw: bool = False,
        ef_search: int = 100,
        pool_size: int = 4,
        schema: str = DEFAULT_SCHEMA,
        scan_batch_rows: int = 8192,
        hnsw_min_rows: int = 2000,
        statement_timeout_ms: int = 30_000,
    ) -> PgVectorStore:
        """Connect, make sure pgvector and our schema exist (or check them), return the store.

        `hnsw` adds an HNSW index per corpus dimension (built at `open_corpus`, concurrently,
        by one replica) and uses it for grants of at least `hnsw_min_rows` rows, with
        `ef_search` candidates per index probe. Raises `UNSAFE_STORE` for a schema that is not
        ours, `STORE_UNAVAILABLE` when the database or pgvector cannot be used.
        """
        check_schema_name(schema)
        for name, value in (
            ("ef_search", ef_search),
            ("scan_batch_rows", scan_batch_rows),
            ("statement_timeout_ms", statement_timeout_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer")
        if isinstance(hnsw_min_rows, bool) or hnsw_min_rows < 0:
            raise ValueError("hnsw_min_rows must be a non-negative integer")
        if ef_search > 1000:
            raise ValueError("ef_search must be at most 1000 (pgvector's limit)")

        ext_schema_box: list[str] = []

        def setup(conn: Connection) -> None:
            if not ext_schema_box:
                ext_schema_box.append(_ensure_extension(conn)[0])
            # Only the extension's schema is searched: its type and operators resolve, and our
            # own tables are always named with their schema.
            conn.execute(
                "SELECT set_config('search_path', quote_ident(%s), false), "
                "set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false)",
                (ext_schema_box[0], str(statement_timeout_ms), str(statement_timeout_ms)),
            )
            register_vector(conn)

        pool = ConnectionPool(dsn, pool_size, setup)
        try:
            with pool.connection() as conn:
                with translated("checking pgvector"):
                    found = _extension(conn)
                version = found[1] if found is not None else (0,)
                if hnsw and version < MIN_PGVECTOR_HNSW:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "HNSW needs pgvector 0.5 or newer in the database.",
                        reason="pgvector-version",
                    )
                ensure_schema_component(
                    conn, schema, COMPONENT, SCHEMA_VERSION, _VECTOR_TABLES, _VECTOR_DDL
                )
        except BaseException:
            pool.close()
            raise
        return cls(
            pool,
            schema,
            hnsw=hnsw,
            iterative_scan=version >= MIN_PGVECTOR_ITERATIVE,
            ef_search=ef_search,
            hnsw_min_rows=hnsw_min_rows,
            scan_batch_rows=scan_batch_rows,
        )

    def __enter__(self) -> PgVectorStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def reclamation(self) -> str:
        """`pending`: deleted rows are reclaimed by (auto)VACUUM, not overwritten at delete."""
        return "pending"

    @property
    def counters(self) -> StoreCounters:
        """A snapshot of the scan counters (they only ever increase).

        For an HNSW index scan, one batch is counted and `rows_scored` counts the rows the
        index returned (PostgreSQL does not report how many it compared).
        """
        with self._lock:
            return self._counters

    @property
    def search_stats(self) -> PgSearchStats:
        """A snapshot of how many searches used the HNSW index, and fell back from it."""
        with self._lock:
            return self._stats

    def close(self) -> None:
        """Close the pool; later calls raise `STORE_UNAVAILABLE`. Idempotent."""
        self._pool.close()
        with self._lock:
            self._corpora.clear()

    # --- corpora -----------------------------------------------------------------------------

    def open_corpus(self, descriptor: CorpusDescriptor) -> None:
        """Store the descriptor on first use; `DESCRIPTOR_MISMATCH` if it differs later."""
        canonical = descriptor.canonical_json()
        dims = descriptor.embedding.dimensions
        with self._pool.connection() as conn:
            with translated("opening a corpus"), _transaction(conn):
                conn.execute(
                    self._sql(
                        "INSERT INTO {s}.corpora (corpus_id, descriptor_json, dimensions) "
                        "VALUES (%s, %s, %s) ON CONFLICT (corpus_id) DO NOTHING"
                    ),
                    (descriptor.corpus_id, canonical, dims),
                )
                row = conn.execute(
                    self._sql("SELECT descriptor_json FROM {s}.corpora WHERE corpus_id = %s"),
                    (descriptor.corpus_id,),
                ).fetchone()
            if row is not None and row[0] != canonical:
                differing = descriptor.mismatch(str(row[0]))
                if differing:
                    raise RetrievalError(
                        ErrorCode.DESCRIPTOR_MISMATCH,
                        f"corpus {descriptor.corpus_id!r} was built with a different "
                        f"descriptor; differing fields: {', '.join(differing)}.",
                    )
            if self._hnsw:
                self._ensure_hnsw_index(conn, dims)
        with self._lock:
            self._corpora[descriptor.corpus_id] = descriptor

    def _ensure_hnsw_index(self, conn: Connection, dims: int) -> None:
        """Build the partial HNSW index for one dimension once, whichever replica gets there.

        CREATE INDEX CONCURRENTLY keeps writes going during the build; replicas take turns
        with a *try* lock (no transaction is held while waiting, which CONCURRENTLY would
        otherwise wait for). An index left invalid by an interrupted build is rebuilt.
        """
        if dims > HNSW_MAX_DIMENSIONS:
            _log.warning(
                "no HNSW index for %d dimensions (pgvector indexes up to %d); exact search",
                dims,
                HNSW_MAX_DIMENSIONS,
            )
            return
        name = f"chunks_hnsw_{dims}"
        key = _lock_key("retrieval-host-hnsw", self._schema, name)
        deadline = time.monotonic() + HNSW_BUILD_WAIT_S
        with translated("building the HNSW index"):
            while True:
                if self._index_state(conn, name) == "valid":
                    return
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() > deadline:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "another replica has been building the HNSW index for too long.",
                        reason="index-build",
                    )
                time.sleep(0.2)  # another replica is building it
            try:
                state = self._index_state(conn, name)
                if state == "invalid":
                    conn.execute(
                        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {s}.{i}").format(
                            s=sql.Identifier(self._schema), i=sql.Identifier(name)
                        )
                    )
                if state != "valid":
                    _log.info("building the HNSW index %s.%s", self._schema, name)
                    conn.execute("SET statement_timeout = 0")
                    conn.execute(
                        sql.SQL("SET maintenance_work_mem = {}").format(
                            sql.Literal(HNSW_BUILD_MEMORY)
                        )
                    )
                    conn.execute(
                        sql.SQL(
                            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {i} ON {s}.chunks "
                            "USING hnsw ((embedding::vector({d})) vector_cosine_ops) "
                            "WITH (m = 16, ef_construction = 64) WHERE dimensions = {d}"
                        ).format(
                            i=sql.Identifier(name),
                            s=sql.Identifier(self._schema),
                            d=sql.Literal(dims),
                        )
                    )
            finally:
                conn.execute("RESET maintenance_work_mem")
                conn.execute("RESET statement_timeout")
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def _index_state(self, conn: Connection, name: str) -> str | None:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_index i ON i.indexrelid = c.oid WHERE n.nspname = %s AND c.relname = %s",
            (self._schema, name),
        ).fetchone()
        if row is None:
            return None
        return "valid" if row[0] else "invalid"

    # --- reads -------------------------------------------------------------------------------

    def get_source(self, corpus: str, namespace: str, source_id: str) -> StoredSource | None:
        """The current revision of a source, or None."""
        if any("\x00" in v for v in (corpus, namespace, source_id)):
            return None  # nothing stored can contain NUL
        with self._pool.connection() as conn, translated("reading a source"):
            row = conn.execute(
                self._sql(
                    "SELECT source_id, revision, title, metadata_json, document_sha256, "
                    "fingerprint, chunk_count FROM {s}.sources "
                    "WHERE corpus_id = %s AND namespace = %s AND source_id = %s"
                ),
                (corpus, namespace, source_id),
            ).fetchone()
        if row is None:
            return None
        return stored_source(row)

    def current_revisions(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None = None
    ) -> dict[str, str]:
        """Source id -> committed current revision in one namespace (see the port): one
        statement over the sources' unique (corpus, namespace, source id) index."""
        self._descriptor(corpus)
        ids = None if source_ids is None else [s for s in source_ids if "\x00" not in s]
        if "\x00" in corpus or "\x00" in namespace or ids == []:
            return {}  # nothing stored can contain NUL
        with self._pool.connection() as conn, translated("reading current revisions"):
            if ids is None:
                rows = conn.execute(
                    self._sql(
                        "SELECT source_id, revision FROM {s}.sources "
                        "WHERE corpus_id = %s AND namespace = %s ORDER BY source_id"
                    ),
                    (corpus, namespace),
                ).fetchall()
            else:
                rows = conn.execute(
                    self._sql(
                        "SELECT source_id, revision FROM {s}.sources WHERE corpus_id = %s "
                        "AND namespace = %s AND source_id = ANY(%s) ORDER BY source_id"
                    ),
                    (corpus, namespace, ids),
                ).fetchall()
        return {str(sid): str(revision) for sid, revision in rows}

    # --- writes ------------------------------------------------------------------------------

    def replace_source(
        self,
        corpus: str,
        namespace: str,
        source: StoredSource,
        chunks: Sequence[StoredChunk],
        *,
        expected_revision: str | None,
        limits: CapacityLimits,
    ) -> None:
        """Swap in one whole revision in one transaction (see the port's contract)."""
        descriptor = self._descriptor(corpus)
        dims = descriptor.embedding.dimensions
        if source.chunk_count != len(chunks):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST, "chunk_count must equal the number of chunks."
            )
        chunk_ids = [c.chunk_id for c in chunks]
        if len(set(chunk_ids)) != len(chunk_ids) or len({c.ordinal for c in chunks}) != len(chunks):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                "chunk ids and ordinals must be unique within a source.",
            )
        raw = _stack(dims, [c.vector for c in chunks], "passage vectors")
        unit_rows(raw, "passage vectors")  # the same value checks as SQLite
        payload = sum(len(c.text.encode("utf-8")) for c in chunks) + raw.shape[0] * dims * 4
        metadata_json = json.dumps(
            source.metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        _reject_nul(
            [
                *(corpus, namespace, source.source_id, source.revision, source.title),
                *(metadata_json, source.document_sha256, source.fingerprint),
                *chunk_ids,
                *(c.text for c in chunks),
                *(c.location.document_id for c in chunks),
            ]
        )
        key = (corpus, namespace, source.source_id)
        with (
            self._pool.connection() as conn,
            translated("replacing a source"),
            _transaction(conn),
        ):
            current_pk, current_payload = self._check_replacement(
                conn, key, expected_revision, chunk_ids, payload, limits
            )
            if current_pk is not None:
                conn.execute(self._sql("DELETE FROM {s}.sources WHERE id = %s"), (current_pk,))
            inserted = conn.execute(
                self._sql(
                    "INSERT INTO {s}.sources (corpus_id, namespace, source_id, revision, "
                    "title, metadata_json, metadata, document_sha256, fingerprint, "
                    "chunk_count, payload_bytes) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s) RETURNING id"
                ),
                (
                    *key,
                    source.revision,
                    source.title,
                    metadata_json,
                    metadata_json,
                    source.document_sha256,
                    source.fingerprint,
                    len(chunks),
                    payload,
                ),
            ).fetchone()
            assert inserted is not None  # RETURNING of a successful INSERT
            self._copy_chunks(conn, int(inserted[0]), key, chunks, raw)
            # Last, so the corpus row stays locked only until the commit right after: this
            # conditional UPDATE is the binding capacity check across concurrent writers.
            delta = payload - current_payload
            total = conn.execute(
                self._sql(
                    "UPDATE {s}.corpora SET payload_bytes = payload_bytes + %s "
                    "WHERE corpus_id = %s AND payload_bytes + %s <= %s RETURNING payload_bytes"
                ),
                (delta, corpus, delta, limits.max_corpus_payload_bytes),
            ).fetchone()
            if total is None:
                raise _capacity(limits)

    def _check_replacement(
        self,
        conn: Connection,
        key: tuple[str, str, str],
        expected_revision: str | None,
        chunk_ids: list[str],
        payload: int,
        limits: CapacityLimits,
    ) -> tuple[int | None, int]:
        """The checks of `replace_source` inside its transaction, after taking the source's
        lock; returns the current row id (None for a new source) and its payload."""
        corpus, namespace, _ = key
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._source_lock(*key),))
        # READ COMMITTED: this statement sees whatever a writer that held the lock committed.
        current = conn.execute(
            self._sql(
                "SELECT id, revision, payload_bytes FROM {s}.sources "
                "WHERE corpus_id = %s AND namespace = %s AND source_id = %s FOR UPDATE"
            ),
            key,
        ).fetchone()
        if (str(current[1]) if current is not None else None) != expected_revision:
            raise _concurrent_writer()
        current_pk = int(current[0]) if current is not None else None
        current_payload = int(current[2]) if current is not None else 0
        taken = conn.execute(
            self._sql(
                "SELECT 1 FROM {s}.chunks WHERE corpus_id = %s AND namespace = %s "
                "AND chunk_id = ANY(%s) AND source_pk IS DISTINCT FROM %s LIMIT 1"
            ),
            (corpus, namespace, chunk_ids, current_pk),
        ).fetchone()
        if taken is not None:
            raise RetrievalError(
                ErrorCode.CHUNK_ID_CONFLICT,
                "a chunk id of this revision is already used by another source in this namespace.",
            )
        used = conn.execute(
            self._sql("SELECT payload_bytes FROM {s}.corpora WHERE corpus_id = %s"), (corpus,)
        ).fetchone()
        if used is None:
            raise _corpus_missing(corpus)
        # An early answer for the common case, before any row is written.
        if int(used[0]) - current_payload + payload > limits.max_corpus_payload_bytes:
            raise _capacity(limits)
        return current_pk, current_payload

    def _copy_chunks(
        self,
        conn: Connection,
        source_pk: int,
        key: tuple[str, str, str],
        chunks: Sequence[StoredChunk],
        raw: _Matrix,
    ) -> None:
        corpus, namespace, _ = key
        dims = raw.shape[1]
        # Chunk-id order: two writers whose ids collide wait on each other in the same order,
        # so they cannot deadlock.
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].chunk_id)
        with (
            conn.cursor() as cur,
            cur.copy(
                self._sql(
                    "COPY {s}.chunks (source_pk, corpus_id, namespace, chunk_id, ordinal, "
                    "text, page, start_line, end_line, document_id, dimensions, embedding) "
                    "FROM STDIN WITH (FORMAT BINARY)"
                )
            ) as copy,
        ):
            copy.set_types(_COPY_TYPES)
            for i in order:
                c, loc = chunks[i], chunks[i].location
                copy.write_row(
                    (
                        *(source_pk, corpus, namespace, c.chunk_id, c.ordinal, c.text),
                        *(loc.page, loc.start_line, loc.end_line, loc.document_id, dims, raw[i]),
                    )
                )

    def delete_source(self, corpus: str, namespace: str, source_id: str, revision: str) -> int:
        """Delete exactly that revision; `SOURCE_UNAVAILABLE` if absent, `SOURCE_CONFLICT` if
        the source is at another revision. Returns the number of passages removed."""
        self._descriptor(corpus)
        if any("\x00" in v for v in (corpus, namespace, source_id)):
            raise source_unavailable()
        with (
            self._pool.connection() as conn,
            translated("deleting a source"),
            _transaction(conn),
        ):
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s)",
                (self._source_lock(corpus, namespace, source_id),),
            )
            current = conn.execute(
                self._sql(
                    "SELECT id, revision, chunk_count, payload_bytes FROM {s}.sources "
                    "WHERE corpus_id = %s AND namespace = %s AND source_id = %s FOR UPDATE"
                ),
                (corpus, namespace, source_id),
            ).fetchone()
            if current is None:
                raise source_unavailable()
            if str(current[1]) != revision:
                raise RetrievalError(
                    ErrorCode.SOURCE_CONFLICT,
                    "the source is at another revision; delete names the exact current revision.",
                    reason="stale-revision",
                )
            conn.execute(self._sql("DELETE FROM {s}.sources WHERE id = %s"), (current[0],))
            conn.execute(
                self._sql(
                    "UPDATE {s}.corpora SET payload_bytes = payload_bytes - %s WHERE corpus_id = %s"
                ),
                (current[3], corpus),
            )
        return int(current[2])

    # --- search ------------------------------------------------------------------------------

    def search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: Mapping[str, JSONScalar] | None = None,
    ) -> list[Candidate]:
        """Top-k cosine matches among the allowed revisions only, best first.

        Rows outside `allowed` (or the namespace, or the filters) are excluded in SQL before
        any distance is ranked. `cancel` is checked before each batch of `scan_batch_rows`
        rows (before the index scan on the HNSW path).
        """
        descriptor = self._descriptor(corpus)
        dims = descriptor.embedding.dimensions
        raw_query = _stack(dims, [query], "the query vector")
        unit_query = unit_rows(raw_query, "the query vector")[0]
        if k <= 0 or not allowed:
            return []
        pairs = [(s, r) for s, r in allowed.items() if "\x00" not in s + r]
        filters_json = json.dumps(dict(filters or {}), allow_nan=False)
        if not pairs or "\x00" in namespace + corpus or "\\u0000" in filters_json:
            return []  # nothing stored can contain NUL

        with (
            self._pool.connection() as conn,
            translated("searching"),
            _transaction(conn, repeatable_read=True, read_only=True),
        ):
            sources = [
                (int(pk), int(count))
                for pk, count in conn.execute(
                    self._sql(
                        "SELECT s.id, s.chunk_count FROM {s}.sources s "
                        "JOIN unnest(%s::text[], %s::text[]) AS a (source_id, revision) "
                        "ON s.source_id = a.source_id AND s.revision = a.revision "
                        "WHERE s.corpus_id = %s AND s.namespace = %s "
                        # Lets the unique index find the granted sources: the cost follows
                        # the grant, not the size of the namespace.
                        "AND s.source_id = ANY(%s::text[]) AND NOT EXISTS ("
                        "SELECT 1 FROM jsonb_each(%s::jsonb) f "
                        "WHERE jsonb_typeof(f.value) IN ('object', 'array') "
                        "OR s.metadata -> f.key IS DISTINCT FROM f.value) "
                        "ORDER BY s.id"
                    ),
                    (
                        [s for s, _ in pairs],
                        [r for _, r in pairs],
                        corpus,
                        namespace,
                        [s for s, _ in pairs],
                        filters_json,
                    ),
                    prepare=False,
                )
                if int(count) > 0
            ]
            total = sum(count for _, count in sources)
            if total == 0:
                return []
            self._count(scans_started=1)
            scored: list[_Scored] | None = None
            if self._hnsw and dims <= HNSW_MAX_DIMENSIONS and total >= self._hnsw_min_rows:
                scored = self._index_scan(conn, dims, sources, raw_query[0], k, cancel)
                if len(scored) < min(k, total):
                    scored = None  # the index gave up early (max_scan_tuples): exact
                    self._stat(exact_fallbacks=1)
            if scored is None:
                scored = self._exact_scan(conn, sources, raw_query[0], k, cancel)
            return self._finish(conn, scored, unit_query, sources, k)

    def _index_scan(
        self,
        conn: Connection,
        dims: int,
        sources: list[tuple[int, int]],
        query: _Matrix,
        k: int,
        cancel: CancelToken,
    ) -> list[_Scored]:
        self._check(cancel)
        conn.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), "
            "set_config('hnsw.iterative_scan', %s, true)",
            (str(self._ef_search), "relaxed_order" if self._iterative else "off"),
        )
        # The dimension is a literal so the planner can match the partial expression index.
        rows = conn.execute(
            sql.SQL(
                "SELECT c.id, c.source_pk, c.ordinal, c.embedding FROM {s}.chunks c "
                "WHERE c.dimensions = {d} AND c.source_pk = ANY(%s) "
                "ORDER BY c.embedding::vector({d}) <=> %s::vector({d}) LIMIT %s"
            ).format(s=sql.Identifier(self._schema), d=sql.Literal(dims)),
            ([pk for pk, _ in sources], query, k),
            binary=True,  # vectors in binary: parsing their text form costs milliseconds
            prepare=False,
        ).fetchall()
        self._count(scan_batches=1, rows_scored=len(rows))
        self._stat(index_scans=1)
        cancel.progress()
        return [_scored(row) for row in rows]

    def _exact_scan(
        self,
        conn: Connection,
        sources: list[tuple[int, int]],
        query: _Matrix,
        k: int,
        cancel: CancelToken,
    ) -> list[_Scored]:
        statement = self._sql(
            "SELECT b.id, b.source_pk, b.ordinal, b.embedding FROM ("
            "SELECT c.id, c.source_pk, c.ordinal, c.embedding FROM {s}.chunks c "
            "WHERE c.source_pk = ANY(%s) ORDER BY c.source_pk, c.ordinal OFFSET %s LIMIT %s"
            ") b ORDER BY b.embedding <=> %s, b.source_pk, b.ordinal LIMIT %s"
        )
        kept: list[_Scored] = []
        for pks, skip, size in _batches(sources, self._batch):
            self._check(cancel)
            rows = conn.execute(
                statement, (pks, skip, size, query, k), binary=True, prepare=False
            ).fetchall()
            kept.extend(_scored(row) for row in rows)
            self._count(scan_batches=1, rows_scored=size)
            cancel.progress()
        return kept

    def _finish(
        self,
        conn: Connection,
        scored: list[_Scored],
        unit_query: _Matrix,
        sources: list[tuple[int, int]],
        k: int,
    ) -> list[Candidate]:
        if not scored:
            return []
        matrix = unit_rows(np.stack([s.vector for s in scored]), "stored vectors")
        scores = matrix @ unit_query
        # Best first; equal scores in (source revision, ordinal) order, as SQLite breaks ties.
        position = {pk: i for i, (pk, _) in enumerate(sources)}
        order = sorted(
            range(len(scored)),
            key=lambda i: (-float(scores[i]), position[scored[i].source_pk], scored[i].ordinal),
        )[:k]
        chosen = [scored[i].pk for i in order]
        details = {
            int(row[0]): row
            for row in conn.execute(
                self._sql(
                    "SELECT c.id, c.chunk_id, c.text, c.page, c.start_line, c.end_line, "
                    "c.document_id, s.source_id, s.revision, s.document_sha256 "
                    "FROM {s}.chunks c JOIN {s}.sources s ON s.id = c.source_pk "
                    "WHERE c.id = ANY(%s)"
                ),
                (chosen,),
                prepare=False,
            )
        }
        results: list[Candidate] = []
        for i in order:
            row = details[scored[i].pk]
            results.append(
                Candidate(
                    chunk_id=str(row[1]),
                    source_id=str(row[7]),
                    revision=str(row[8]),
                    text=str(row[2]),
                    location=Location(row[3], row[4], row[5], row[6]),
                    document_sha256=str(row[9]),
                    score=float(np.clip(scores[i], -1.0, 1.0)),
                )
            )
        return results

    # --- helpers -------------------------------------------------------------------------------

    def _sql(self, template: str) -> sql.Composed:
        return _schema_sql(self._schema, template)

    def _source_lock(self, corpus: str, namespace: str, source_id: str) -> int:
        """The advisory lock key that serialises writers of one source across replicas."""
        return _lock_key("retrieval-host-source", self._schema, corpus, namespace, source_id)

    def _descriptor(self, corpus: str) -> CorpusDescriptor:
        if self._pool.closed:
            raise _closed()
        with self._lock:
            descriptor = self._corpora.get(corpus)
        if descriptor is None:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"corpus {corpus!r} has not been opened on this store.",
                reason="corpus-not-open",
            )
        return descriptor

    def _check(self, cancel: CancelToken) -> None:
        try:
            cancel.check()
        except RetrievalError:
            self._count(scans_cancelled=1)
            raise

    def _count(
        self,
        *,
        scans_started: int = 0,
        scan_batches: int = 0,
        scans_cancelled: int = 0,
        rows_scored: int = 0,
    ) -> None:
        with self._lock:
            c = self._counters
            self._counters = StoreCounters(
                c.scans_started + scans_started,
                c.scan_batches + scan_batches,
                c.scans_cancelled + scans_cancelled,
                c.rows_scored + rows_scored,
            )

    def _stat(self, *, index_scans: int = 0, exact_fallbacks: int = 0) -> None:
        with self._lock:
            s = self._stats
            self._stats = PgSearchStats(
                s.index_scans + index_scans, s.exact_fallbacks + exact_fallbacks
            )


def _scored(row: tuple[Any, ...]) -> _Scored:
    value = row[3]
    vector = value.to_numpy() if hasattr(value, "to_numpy") else value  # a pgvector `Vector`
    return _Scored(int(row[0]), int(row[1]), int(row[2]), np.asarray(vector, dtype=np.float32))


def _batches(sources: list[tuple[int, int]], size: int) -> Iterator[tuple[list[int], int, int]]:
    """Split the rows of `sources` (in source, ordinal order) into runs of `size` rows.

    Each run is (source pks it touches, rows of the first source to skip, row count): the rows
    a query ordered by (source_pk, ordinal) returns after OFFSET skip LIMIT count.
    """
    total = sum(count for _, count in sources)
    at = 0  # index of the first source still holding unscanned rows
    used = 0  # rows of that source already scanned
    for start in range(0, total, size):
        count = min(size, total - start)
        skip = used
        pks: list[int] = []
        need = count
        while need > 0:
            pk, n = sources[at]
            pks.append(pk)
            take = min(n - used, need)
            need -= take
            used += take
            if used == n:
                at += 1
                used = 0
        yield pks, skip, count


def _capacity(limits: CapacityLimits) -> RetrievalError:
    return RetrievalError(
        ErrorCode.CAPACITY_EXCEEDED,
        f"the corpus may hold at most {limits.max_corpus_payload_bytes} bytes of passages "
        "and vectors.",
        reason="corpus-payload",
    )


def _corpus_missing(corpus: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"corpus {corpus!r} is missing from the database.",
        reason="corpus-missing",
    )

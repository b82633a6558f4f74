"""The PostgreSQL + pgvector vector store: several host replicas share one database.

Same contract, errors and reasons as the SQLite store (`core.ports.VectorStore`); what differs is
where the work happens and what makes it safe across processes.

Layout. Tables live in one dedicated PostgreSQL schema, created or checked by `schema`
(`UNSAFE_STORE` for a schema that is not ours, as SQLite). Searching is `search.Searcher`;
the lexical index (BM25 from stored term statistics, written with the vectors) is `lexical`.

Deletion. `reclamation` is `pending`: PostgreSQL removes dead tuples at VACUUM (autovacuum)
and the bytes stay in the data files and WAL until reused; nothing is overwritten at delete.

Connections. A small internal pool (`pool.ConnectionPool`, `pool_size`) of autocommit
connections; each carries a session `search_path` naming the extension's schema, the pgvector
type adapters and the timeouts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Final

from psycopg import sql

from retrieval_host.adapters._store_rules import (
    SOURCE_COLUMNS,
    CounterTally,
    StoreBase,
    StoreCounters,
    capacity_exceeded,
    check_descriptor,
    check_expected_revision,
    checked_replacement,
    chunk_id_taken,
    closed,
    corpus_missing,
    corpus_not_open,
    missing_from_read_only,
    stale_revision,
    stored_source,
)
from retrieval_host.adapters.postgres import inspect, lexical
from retrieval_host.adapters.postgres.catalog import (
    read_descriptor,
    read_indexed_at,
    read_revisions,
)
from retrieval_host.adapters.postgres.pool import (
    Connection,
    ConnectionPool,
    answer_timeout_s,
    lock_key,
    transaction,
    translated,
)
from retrieval_host.adapters.postgres.schema import (
    COPY_TYPES,
    DEFAULT_SCHEMA,
    check_schema_name,
    ensure_hnsw_index,
    ensure_vector_schema,
    extension,
    schema_sql,
    session_setup,
)
from retrieval_host.adapters.postgres.search import Matrix, PgSearchStats, Searcher
from retrieval_host.adapters.postgres.searching import PgSearch
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import (
    ErrorCode,
    RetrievalError,
    source_unavailable,
    store_read_only,
)
from retrieval_host.core.ports import (
    CapacityLimits,
    StoredChunk,
    StoredSource,
)
from retrieval_host.core.reasons import InvalidRequestReason, StoreUnavailableReason

__all__ = ["PgSearchStats", "PgVectorStore", "StoreCounters"]

MIN_PGVECTOR_HNSW: Final = (0, 5, 0)
MIN_PGVECTOR_ITERATIVE: Final = (0, 8, 0)

_log = logging.getLogger(__name__)


class PgVectorStore(StoreBase, PgSearch, inspect.PgInspection):
    """The scale-out vector store (implements `core.ports.VectorStore`); create with `open()`.

    Thread-safe: every call borrows a pooled connection. Any number of instances, in any
    number of processes, may share one database schema. In `counters`, an HNSW index scan
    counts one batch, and `rows_scored` the rows the index returned (PostgreSQL does not
    report how many it compared).
    """

    def __init__(
        self,
        pool: ConnectionPool,
        schema: str,
        searcher: Searcher,
        read_only: bool = False,
    ) -> None:
        """Private: use `PgVectorStore.open(dsn)`, which prepares the schema."""
        self._read_only = read_only
        self._pool = pool
        self._schema = schema
        self._lock = threading.Lock()
        self._corpora: dict[str, CorpusDescriptor] = {}
        self._counters = searcher.counters
        self._searcher = searcher
        # Each source revision's lexical totals (BM25's N and length over a grant).
        self._source_totals = lexical.SourceTotals()

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
        read_only: bool = False,
        migrate: bool = True,
    ) -> PgVectorStore:
        """Connect, make sure pgvector and our schema exist (or check them), return the store.

        `hnsw` adds an HNSW index per corpus dimension (built at `open_corpus`, concurrently,
        by one replica) and uses it for grants of at least `hnsw_min_rows` rows, with
        `ef_search` candidates per index probe. Raises `UNSAFE_STORE` for a schema that is not
        ours, `STORE_UNAVAILABLE` when the database or pgvector cannot be used.

        `read_only` (a hot standby, a role without write rights): every session is read-only
        (`default_transaction_read_only`), nothing is created or migrated, the schema must be
        current (`STORE_UNAVAILABLE` `missing-store` when it is not there, `STORE_READ_ONLY`
        when it is of an earlier version) and the corpora must exist; writes are
        `STORE_READ_ONLY`. `migrate=False` refuses (`UNSAFE_STORE`) a schema of an earlier
        version instead of migrating it (the ingest command: a migration is the host's, at its
        start).
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

        pool = ConnectionPool(
            dsn,
            pool_size,
            session_setup(statement_timeout_ms, read_only),
            answer_timeout_s=answer_timeout_s(statement_timeout_ms),
        )
        try:
            with pool.connection() as conn:
                with translated("checking pgvector"):
                    found = extension(conn)
                version = found[1] if found is not None else (0,)
                if hnsw and version < MIN_PGVECTOR_HNSW:
                    raise RetrievalError(
                        ErrorCode.STORE_UNAVAILABLE,
                        "HNSW needs pgvector 0.5 or newer in the database.",
                        reason=StoreUnavailableReason.PGVECTOR_VERSION,
                    )
                ensure_vector_schema(
                    conn,
                    schema,
                    lambda conn, found: lexical.backfill(conn, schema, found),
                    migrate=migrate,
                    read_only=read_only,
                )
                if not read_only:
                    with translated("preparing the schema"), transaction(conn):
                        conn.execute(
                            "SELECT pg_advisory_xact_lock(%s)",
                            (lock_key("retrieval-host-schema", schema),),
                        )
                        healed = lexical.heal(conn, schema)
                    if healed:
                        _log.warning(
                            "analyzed %d passages that a replica of an earlier release wrote "
                            "after the schema was migrated (stop every earlier replica before "
                            "a release that migrates the schema)",
                            healed,
                        )
        except BaseException:
            pool.close()
            raise
        searcher = Searcher(
            schema,
            CounterTally(),
            hnsw=hnsw,
            iterative_scan=version >= MIN_PGVECTOR_ITERATIVE,
            ef_search=ef_search,
            hnsw_min_rows=hnsw_min_rows,
            scan_batch_rows=scan_batch_rows,
        )
        return cls(pool, schema, searcher, read_only)

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def reclamation(self) -> str:
        """`pending`: deleted rows are reclaimed by (auto)VACUUM, not overwritten at delete."""
        return "pending"

    @property
    def search_stats(self) -> PgSearchStats:
        """A snapshot of how many searches used the HNSW index, and fell back from it."""
        return self._searcher.stats

    def close(self) -> None:
        """Close the pool; later calls raise `STORE_UNAVAILABLE`. Idempotent."""
        self._pool.close()
        with self._lock:
            self._corpora.clear()

    # --- corpora -----------------------------------------------------------------------------

    def stored_descriptor(self, corpus: str) -> str | None:
        """The descriptor stored by the corpus's first open (canonical JSON), or None."""
        if "\x00" in corpus:
            return None  # nothing stored can contain NUL
        with self._pool.connection() as conn, translated("reading a corpus descriptor"):
            return read_descriptor(conn, self._schema, corpus)

    def open_corpus(self, descriptor: CorpusDescriptor) -> None:
        """Store the descriptor on first use; `DESCRIPTOR_MISMATCH` if it differs later (read-only:
        the corpus must exist, `STORE_READ_ONLY` otherwise)."""
        canonical = descriptor.canonical_json()
        dims = descriptor.embedding.dimensions
        if self._read_only:
            stored = self.stored_descriptor(descriptor.corpus_id)
            if stored is None:
                raise missing_from_read_only(descriptor.corpus_id)
            check_descriptor(descriptor, stored)
            with self._lock:
                self._corpora[descriptor.corpus_id] = descriptor
            return
        with self._pool.connection() as conn:
            with translated("opening a corpus"), transaction(conn):
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
            if row is not None:
                check_descriptor(descriptor, str(row[0]))
            if self._searcher.hnsw:
                ensure_hnsw_index(conn, self._schema, dims)
        with self._lock:
            self._corpora[descriptor.corpus_id] = descriptor

    # --- reads -------------------------------------------------------------------------------

    def get_source(self, corpus: str, namespace: str, source_id: str) -> StoredSource | None:
        """The current revision of a source, or None."""
        if any("\x00" in v for v in (corpus, namespace, source_id)):
            return None  # nothing stored can contain NUL
        with self._pool.connection() as conn, translated("reading a source"):
            row = conn.execute(
                self._sql(
                    f"SELECT {SOURCE_COLUMNS}, id FROM {{s}}.sources "  # noqa: S608
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
            return read_revisions(conn, self._schema, corpus, namespace, ids)

    def indexed_at(
        self, corpus: str, namespace: str, source_ids: Collection[str]
    ) -> dict[str, tuple[str, str | None]]:
        """Source id -> (current revision, commit time) for the ids that exist (see the port)."""
        self._descriptor(corpus)
        ids = [s for s in source_ids if "\x00" not in s]
        if "\x00" in corpus or "\x00" in namespace or not ids:
            return {}
        with self._pool.connection() as conn, translated("reading index times"):
            return read_indexed_at(conn, self._schema, corpus, namespace, ids)

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
        if self._read_only:
            raise store_read_only(corpus)
        descriptor = self._descriptor(corpus)
        checked = checked_replacement(
            descriptor.embedding.dimensions, descriptor.lexical.chosen, source, chunks
        )
        chunk_ids, metadata_json, payload = (
            checked.chunk_ids,
            checked.metadata_json,
            checked.payload,
        )
        _reject_nul(
            [
                *(corpus, namespace, source.source_id, source.revision, source.title),
                *(metadata_json, source.document_sha256, source.fingerprint),
                *(source.media_type, source.indexed_at),
                *chunk_ids,
                *(c.text for c in chunks),
                *(c.location.document_id for c in chunks),
            ]
        )
        key = (corpus, namespace, source.source_id)
        with (
            self._pool.connection() as conn,
            translated("replacing a source"),
            transaction(conn),
        ):
            current_pk, current_payload = self._check_replacement(
                conn, key, expected_revision, chunk_ids, payload, limits
            )
            gone = (0, 0)
            if current_pk is not None:
                gone = lexical.indexed_totals(conn, self._schema, current_pk)
                conn.execute(self._sql("DELETE FROM {s}.sources WHERE id = %s"), (current_pk,))
            inserted = conn.execute(
                self._sql(
                    "INSERT INTO {s}.sources (corpus_id, namespace, source_id, revision, "
                    "title, metadata_json, metadata, document_sha256, fingerprint, "
                    "chunk_count, payload_bytes, media_type, indexed_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s) "
                    "RETURNING id"
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
                    source.media_type,
                    source.indexed_at,
                ),
            ).fetchone()
            assert inserted is not None  # RETURNING of a successful INSERT
            self._copy_chunks(conn, int(inserted[0]), key, chunks, checked.raw, checked.terms)
            # The lexical index in the same transaction as the vectors.
            space_pk = lexical.space(conn, self._schema, corpus, namespace)
            lexical.write_terms(
                conn,
                self._schema,
                space_pk,
                int(inserted[0]),
                {c.ordinal: t for c, t in zip(chunks, checked.terms, strict=True)},
            )
            added = sum(sum(t.values()) for t in checked.terms)
            lexical.add_to_space(
                conn, self._schema, space_pk, len(chunks) - gone[0], added - gone[1]
            )
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
                raise capacity_exceeded(limits)

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
        if current is None:
            check_expected_revision(None, None, expected_revision)
        else:  # the version is the row id (`_store_rules.stored_source`)
            check_expected_revision(str(current[1]), str(current[0]), expected_revision)
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
            raise chunk_id_taken()
        used = conn.execute(
            self._sql("SELECT payload_bytes FROM {s}.corpora WHERE corpus_id = %s"), (corpus,)
        ).fetchone()
        if used is None:
            raise corpus_missing(corpus)
        # An early answer for the common case, before any row is written.
        if int(used[0]) - current_payload + payload > limits.max_corpus_payload_bytes:
            raise capacity_exceeded(limits)
        return current_pk, current_payload

    def _copy_chunks(
        self,
        conn: Connection,
        source_pk: int,
        key: tuple[str, str, str],
        chunks: Sequence[StoredChunk],
        raw: Matrix,
        terms: Sequence[Mapping[str, int]],
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
                    "text, page, start_line, end_line, document_id, dimensions, embedding, "
                    "term_count) "
                    "FROM STDIN WITH (FORMAT BINARY)"
                )
            ) as copy,
        ):
            copy.set_types(COPY_TYPES)
            for i in order:
                c, loc = chunks[i], chunks[i].location
                copy.write_row(
                    (
                        *(source_pk, corpus, namespace, c.chunk_id, c.ordinal, c.text),
                        *(loc.page, loc.start_line, loc.end_line, loc.document_id, dims, raw[i]),
                        sum(terms[i].values()),
                    )
                )

    def delete_source(self, corpus: str, namespace: str, source_id: str, revision: str) -> int:
        """Delete exactly that revision; `SOURCE_UNAVAILABLE` if absent, `SOURCE_CONFLICT` if
        the source is at another revision. Returns the number of passages removed."""
        if self._read_only:
            raise store_read_only(corpus)
        self._descriptor(corpus)
        if any("\x00" in v for v in (corpus, namespace, source_id)):
            raise source_unavailable()
        with (
            self._pool.connection() as conn,
            translated("deleting a source"),
            transaction(conn),
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
                raise stale_revision()
            gone = lexical.indexed_totals(conn, self._schema, int(current[0]))
            conn.execute(self._sql("DELETE FROM {s}.sources WHERE id = %s"), (current[0],))
            if gone[0]:
                space_pk = lexical.space(conn, self._schema, corpus, namespace)
                lexical.add_to_space(conn, self._schema, space_pk, -gone[0], -gone[1])
            conn.execute(
                self._sql(
                    "UPDATE {s}.corpora SET payload_bytes = payload_bytes - %s WHERE corpus_id = %s"
                ),
                (current[3], corpus),
            )
        return int(current[2])

    # --- helpers -------------------------------------------------------------------------------

    def _sql(self, template: str) -> sql.Composed:
        return schema_sql(self._schema, template)

    def _source_lock(self, corpus: str, namespace: str, source_id: str) -> int:
        """The advisory lock key that serialises writers of one source across replicas."""
        return lock_key("retrieval-host-source", self._schema, corpus, namespace, source_id)

    def _descriptor(self, corpus: str) -> CorpusDescriptor:
        if self._pool.closed:
            raise closed()
        with self._lock:
            descriptor = self._corpora.get(corpus)
        if descriptor is None:
            raise corpus_not_open(corpus)
        return descriptor

    # --- inspection (`adapters/postgres/inspect.py`) -------------------------------------------

    @contextlib.contextmanager
    def _inspecting(self, corpus: str, doing: str) -> Iterator[tuple[Connection, str, int]]:
        dims = self._descriptor(corpus).embedding.dimensions  # an unopened corpus says so
        with self._pool.connection() as conn, translated(doing):
            yield conn, self._schema, dims


def _reject_nul(values: Sequence[str | None]) -> None:
    # PostgreSQL text and jsonb cannot hold U+0000; refuse rather than alter the content.
    if any(v is not None and "\x00" in v for v in values):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "text stored in PostgreSQL must not contain the NUL character (U+0000).",
            reason=InvalidRequestReason.NUL_CHARACTER,
        )

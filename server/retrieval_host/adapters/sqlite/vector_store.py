"""The embedded SQLite vector store: durable rows in SQLite, similarity in NumPy.

Durability. Sources and passages live in one SQLite file, opened and checked by `schema` (file
safety, identity, pragmas). A source revision is replaced in one `BEGIN IMMEDIATE` transaction,
so a reader (in this process or another) sees the old revision or the new one.

Lexical search. Each corpus namespace also has an in-memory inverted index (`lexicon.Lexicon`:
why not FTS5), built from the passages' stored term frequencies, changed with the vectors.

Search. Vectors are never read from SQLite per query: each corpus namespace is held in memory
(`segment.Segment`). A query collects the row spans of the allowed `(source, revision)` pairs
whose metadata match the filters, then scores only those rows (`scan.Scanner`); a scattered
grant that is searched again and again is scored from a bounded cache of contiguous copies of
its rows (`grant_cache.GrantCache`). The in-memory index is updated in place after this store's
own commits and reloaded per changed source when a per-corpus generation counter shows that
another connection committed.

Snapshots. The in-memory index of a corpus is also written to a file beside the database
(`snapshot`, `snapshotting`) that a later open maps instead of reading every row from SQLite,
shared by the worker processes of one host. SQLite stays the authority: an open keeps only the
snapshot's sources SQLite still holds as written, and loads what changed since.

Concurrency. Writers are serialised by a process-wide lock per database file and, across
processes, by SQLite's own locking (with a busy timeout). A search holds no lock while scoring.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import apsw
import numpy as np

from retrieval_host.adapters._store_rules import (
    SOURCE_COLUMNS,
    CounterTally,
    StoreBase,
    StoreCounters,
    check_descriptor,
    checked_replacement,
    closed,
    corpus_not_open,
    missing_from_read_only,
    stale_revision,
    stored_source,
    terms_json,
)
from retrieval_host.adapters.sqlite import inspect
from retrieval_host.adapters.sqlite.approximate import DEFAULT_MIN_ROWS, Builder
from retrieval_host.adapters.sqlite.catalog import (
    Readers,
    read_descriptor,
    read_indexed_at,
    store_descriptor,
)
from retrieval_host.adapters.sqlite.files import OpenedFile
from retrieval_host.adapters.sqlite.grant_cache import DEFAULT_GRANT_CACHE_BYTES, GrantCache
from retrieval_host.adapters.sqlite.scan import DEFAULT_SCAN_BATCH_ROWS, Scanner
from retrieval_host.adapters.sqlite.schema import (
    immediate,
    one,
    open_database,
    opens_immutable,
    path_lock,
    transaction,
    translated,
    truncate_wal,
)
from retrieval_host.adapters.sqlite.searching import SqliteSearch
from retrieval_host.adapters.sqlite.segment import CorpusState, Loaded, Revision
from retrieval_host.adapters.sqlite.snapshotting import SqliteSnapshots
from retrieval_host.adapters.sqlite.tables import (
    APPLICATION_ID,
    IDENTITY,
    SCHEMA_VERSION,
    bump_generation,
    check_replacement,
    committed_generation,
    load_revision,
)
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import (
    RetrievalError,
    source_unavailable,
    store_read_only,
)
from retrieval_host.core.ports import (
    CapacityLimits,
    StoredChunk,
    StoredSource,
)
from retrieval_host.core.waits import locked, refuse_wait
from retrieval_host.cpus import usable_cores

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteVectorStore", "StoreCounters"]

_log = logging.getLogger(__name__)

# The first load of a corpus from SQLite is applied in batches of about this many rows.
LOAD_BATCH_ROWS = 50_000


def _batches(items: list[tuple[int, int]], rows: int) -> Iterator[list[tuple[int, int]]]:
    """`(key, count)` items in consecutive batches of about `rows` counted rows each."""
    batch: list[tuple[int, int]] = []
    total = 0
    for item in items:
        batch.append(item)
        total += item[1]
        if total >= rows:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


class SqliteVectorStore(StoreBase, SqliteSearch, SqliteSnapshots, inspect.SqliteInspection):
    """The embedded vector store (implements `core.ports.VectorStore`); create with `open()`.

    Thread-safe: the service calls it from a thread pool. One SQLite connection per instance,
    used under a lock, plus one read-only connection per searching thread for the freshness
    check; searches score outside every lock.
    """

    def __init__(
        self,
        connection: apsw.Connection,
        path: Path,
        scan_batch_rows: int,
        grant_cache_bytes: int = DEFAULT_GRANT_CACHE_BYTES,
        read_only: bool = False,
        trusted_groups: frozenset[int] = frozenset(),
        snapshots: bool = True,
        approximate_min_rows: int = DEFAULT_MIN_ROWS,
    ) -> None:
        """Private: use `SqliteVectorStore.open(path)`, which checks and prepares the file."""
        self._read_only = read_only
        self._trusted_groups = trusted_groups
        self._snapshots = snapshots
        self._snapshot_lock = threading.Lock()  # one snapshot written at a time
        self._snapshot_writer: threading.Thread | None = None
        self._erasing: set[str] = set()  # corpora whose snapshot still holds deleted rows
        self._eraser: threading.Thread | None = None
        self._conn: apsw.Connection | None = connection
        self._path = path
        self._file = OpenedFile(path)  # the file this store opened (checked before writes)
        self._write_lock = path_lock(path)
        self._db_lock = threading.RLock()
        self._cache_lock = threading.Lock()
        self._counters = CounterTally()
        self._corpora: dict[str, CorpusState] = {}
        self._scanner = Scanner(scan_batch_rows, self._counters.add)
        self._grants = GrantCache(grant_cache_bytes)
        self._approximate_min_rows = approximate_min_rows
        self._graphs = Builder(self._under_cache_lock, max(1, usable_cores() - 1), not read_only)
        # Per-thread read-only connections for the freshness check of every search.
        self._readers = Readers(path, immutable=opens_immutable(path, read_only))

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        scan_batch_rows: int = DEFAULT_SCAN_BATCH_ROWS,
        grant_cache_bytes: int = DEFAULT_GRANT_CACHE_BYTES,
        trusted_groups: frozenset[int] = frozenset(),
        read_only: bool = False,
        snapshots: bool = True,
        approximate_min_rows: int = DEFAULT_MIN_ROWS,
        migrate: bool = True,
    ) -> SqliteVectorStore:
        """Open (creating if missing) the store at `path` after the private-location checks.

        `grant_cache_bytes` bounds the copies of repeatedly searched, scattered grants (see
        `GrantCache`; 0: off). `trusted_groups` may write to the store's directory and files
        (`files.own_groups()` on a volume provisioned for the host's group; see `files`).
        `read_only` opens an existing store (a snapshot, a copy) without writing to it: writes
        are `STORE_READ_ONLY`. `snapshots`: map each corpus's index snapshot at open and write
        one when enough changed (`snapshot`; a read-only store maps them, never writes one).
        `approximate_min_rows`: a search allowed every live row of a namespace of at least
        this many rows ranks with an approximate graph (`approximate`); 0 never does.
        `migrate=False`: an earlier schema version is `UNSAFE_STORE`, not migrated (`ingest`).

        Raises `UNSAFE_STORE` for an unsafe location, an unrelated or newer database, or a
        SQLite build older than 3.51.3; `STORE_UNAVAILABLE` when SQLite cannot open the file.
        """
        if isinstance(scan_batch_rows, bool) or scan_batch_rows < 1:
            raise ValueError("scan_batch_rows must be a positive integer")
        if isinstance(grant_cache_bytes, bool) or grant_cache_bytes < 0:
            raise ValueError("grant_cache_bytes must be a non-negative integer")
        if isinstance(approximate_min_rows, bool) or approximate_min_rows < 0:
            raise ValueError("approximate_min_rows must be a non-negative integer")
        conn, database = open_database(
            path, IDENTITY, trusted_groups, read_only=read_only, upgrade=migrate, create=True
        )
        return cls(
            conn,
            database,
            scan_batch_rows,
            grant_cache_bytes,
            read_only,
            trusted_groups,
            snapshots,
            approximate_min_rows,
        )

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def reclamation(self) -> str:
        """`overwritten`: `secure_delete` zeroes freed pages and deletes checkpoint the WAL;
        `pending` with index snapshots, which a delete rewrites in the background."""
        return "pending" if self._snapshots and not self._read_only else "overwritten"

    def close(self) -> None:
        """Write the snapshot of each corpus that changed since its last one, then close the
        connection; later calls raise `STORE_UNAVAILABLE`. Idempotent."""
        self._graphs.close()
        for writer in (self._snapshot_writer, self._eraser):
            if writer is not None:
                writer.join()
        with self._cache_lock:
            pending = [s for s in self._corpora.values() if s.unsnapshotted]
        for state in pending:
            self._write_snapshot(state)
        with self._db_lock:
            self._readers.close()
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            with self._cache_lock:
                self._corpora.clear()
        self._scanner.close()
        self._grants.clear()

    # --- corpora -----------------------------------------------------------------------------

    def stored_descriptor(self, corpus: str) -> str | None:
        """The descriptor stored by the corpus's first open (canonical JSON), or None."""
        with self._db_lock, translated("reading a corpus descriptor"):
            return read_descriptor(self._connection(), corpus)

    def open_corpus(self, descriptor: CorpusDescriptor) -> None:
        """Store the descriptor on first use; `DESCRIPTOR_MISMATCH` if it differs later (read-only:
        the corpus must exist, `STORE_READ_ONLY` otherwise)."""
        if self._read_only:
            stored = self.stored_descriptor(descriptor.corpus_id)
            if stored is None:
                raise missing_from_read_only(descriptor.corpus_id)
            check_descriptor(descriptor, stored)
        else:
            with self._write_lock, self._db_lock:
                conn = self._connection()
                with translated("opening a corpus"), immediate(conn):
                    analyzed = store_descriptor(conn, descriptor)
            if analyzed:
                _log.info("analyzed %d stored passages for the lexical index", analyzed)
        # Loading the vectors can take a while on a big corpus: other writers need not wait.
        self._load(descriptor)

    def _load(self, descriptor: CorpusDescriptor) -> None:
        """Load (or bring up to date) the corpus's in-memory index."""
        stale = False
        with self._db_lock:
            state = self._corpora.get(descriptor.corpus_id)
            if state is None or state.descriptor != descriptor:
                state = CorpusState(descriptor, {}, {}, -1)
                if self._snapshots:
                    stale = self._adopt_snapshot(state)
                with self._cache_lock:
                    self._corpora[descriptor.corpus_id] = state
            self._refresh(state)
        if stale:  # its file holds rows no longer live: rewritten without them
            self._erase_from_snapshot(state)
        self._snapshot_if_due(state)

    # --- reads -------------------------------------------------------------------------------

    def get_source(self, corpus: str, namespace: str, source_id: str) -> StoredSource | None:
        """The current revision of a source, read from SQLite (authoritative), or None."""
        self._file.check()
        with locked(self._db_lock, "the store's connection"), translated("reading a source"):
            row = (
                self._connection()
                .execute(
                    f"SELECT {SOURCE_COLUMNS}, generation FROM sources "  # noqa: S608
                    "WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
                    (corpus, namespace, source_id),
                )
                .fetchone()
            )
        if row is None:
            return None
        return stored_source(row)

    def current_revisions(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None = None
    ) -> dict[str, str]:
        """Source id -> committed current revision in one namespace (see the port).

        Answered from the in-memory index after the same freshness check a search makes (one
        row read on this thread's own connection; a commit by another connection or process
        is loaded first), so an authorizer can call it on every request.
        """
        state = self._state(corpus)
        self._ensure_fresh(state)
        with locked(self._cache_lock, "the store's index"):
            segment = state.segments.get(namespace)
            if segment is None:
                return {}
            spans = segment.spans
            if source_ids is None:
                return {sid: span.revision for sid, span in spans.items()}
            get = spans.get
            return {sid: span.revision for sid in source_ids if (span := get(sid)) is not None}

    def indexed_at(
        self, corpus: str, namespace: str, source_ids: Collection[str]
    ) -> dict[str, tuple[str, str | None]]:
        """Source id -> (current revision, commit time) for the ids that exist (see the port),
        read from SQLite in one statement on this thread's own read connection (every search
        asks for its hits': no shared lock to queue on)."""
        self._state(corpus)
        with translated("reading index times"):
            return read_indexed_at(self._reader(), corpus, namespace, source_ids)

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
        """Swap in one whole revision in one IMMEDIATE transaction (see the port's contract)."""
        if self._read_only:
            raise store_read_only(corpus)
        state = self._state(corpus)
        checked = checked_replacement(
            state.dimensions, state.descriptor.lexical.chosen, source, chunks
        )
        blobs = [row.astype("<f4").tobytes() for row in checked.raw]
        key = (corpus, namespace, source.source_id)
        self._file.check()

        with self._write_lock, self._db_lock:
            conn = self._connection()
            with translated("replacing a source"), immediate(conn):
                current_pk = check_replacement(
                    conn, key, expected_revision, checked.chunk_ids, checked.payload, limits
                )
                before, generation = bump_generation(conn, corpus)
                if current_pk is not None:
                    conn.execute("DELETE FROM sources WHERE id = ?", (current_pk,))
                source_pk = one(
                    conn.execute(
                        "INSERT INTO sources (corpus_id, namespace, source_id, revision, "
                        "title, metadata_json, document_sha256, fingerprint, chunk_count, "
                        "payload_bytes, generation, media_type, indexed_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                        (
                            *key,
                            source.revision,
                            source.title,
                            checked.metadata_json,
                            source.document_sha256,
                            source.fingerprint,
                            len(chunks),
                            checked.payload,
                            generation,
                            source.media_type,
                            source.indexed_at,
                        ),
                    )
                )[0]
                conn.executemany(
                    "INSERT INTO chunks (source_pk, corpus_id, namespace, chunk_id, "
                    "ordinal, text, page, start_line, end_line, document_id, vector, terms) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            source_pk,
                            corpus,
                            namespace,
                            c.chunk_id,
                            c.ordinal,
                            c.text,
                            c.location.page,
                            c.location.start_line,
                            c.location.end_line,
                            c.location.document_id,
                            blob,
                            terms_json(terms),
                        )
                        for c, blob, terms in zip(chunks, blobs, checked.terms, strict=True)
                    ],
                )
            # Chunks enter the index in ordinal order, the order a reload reads them back in.
            order = sorted(range(len(chunks)), key=lambda i: chunks[i].ordinal)
            loaded = Loaded(
                namespace,
                Revision(
                    source.source_id,
                    source.revision,
                    source.document_sha256,
                    json.loads(checked.metadata_json),
                    generation,
                    source.media_type,
                ),
                tuple(
                    (chunks[i].chunk_id, chunks[i].text.encode("utf-8"), chunks[i].location)
                    for i in order
                ),
                checked.unit[order],
                tuple(checked.terms[i] for i in order),
            )
            self._after_commit(state, before, generation, [loaded], [])

    def delete_source(self, corpus: str, namespace: str, source_id: str, revision: str) -> int:
        """Delete exactly that revision; `SOURCE_UNAVAILABLE` if absent, `SOURCE_CONFLICT` if
        the source is at another revision. Returns the number of passages removed."""
        if self._read_only:
            raise store_read_only(corpus)
        state = self._state(corpus)
        self._file.check()
        with self._write_lock, self._db_lock:
            conn = self._connection()
            with translated("deleting a source"), immediate(conn):
                current = conn.execute(
                    "SELECT id, revision FROM sources "
                    "WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
                    (corpus, namespace, source_id),
                ).fetchone()
                if current is None:
                    raise source_unavailable()
                if str(current[1]) != revision:
                    raise stale_revision()
                removed = int(
                    one(
                        conn.execute(
                            "SELECT COUNT(*) FROM chunks WHERE source_pk = ?", (current[0],)
                        )
                    )[0]
                )
                before, generation = bump_generation(conn, corpus)
                conn.execute("DELETE FROM sources WHERE id = ?", (current[0],))
            self._after_commit(state, before, generation, [], [(namespace, source_id)])
            truncate_wal(conn)
        self._after_delete(state)
        return removed

    # --- cache maintenance ---------------------------------------------------------------------

    def _ensure_fresh(self, state: CorpusState) -> None:
        """Reload what other connections committed since the cache was last brought up to date.

        The generation is read on the calling thread's own read-only connection, outside the
        store's lock: with one shared connection, concurrent searches queued on its lock
        (each holder also waiting for the GIL to come back from SQLite). Only a changed
        generation takes the lock, and checks again on the main connection before reloading.
        """
        corpus = state.descriptor.corpus_id
        if committed_generation(self._reader(), corpus) == state.loaded_generation:
            return
        refuse_wait("a reload of the store's index")  # on the event loop (`core.waits`)
        with self._db_lock:
            if committed_generation(self._connection(), corpus) != state.loaded_generation:
                self._refresh(state)

    def _reader(self) -> apsw.Connection:
        """This thread's read-only connection to the store (opened on first use)."""
        conn = self._readers.get()
        if conn is None:
            raise closed()  # a close ran, or is running (its main connection may be open yet)
        return conn

    def _after_commit(
        self,
        state: CorpusState,
        before: int,
        generation: int,
        loaded: list[Loaded],
        removed: list[tuple[str, str]],
    ) -> None:
        # Caller holds the db lock. Apply our own change directly only when the cache was
        # exactly at the generation our transaction started from; otherwise another
        # connection committed in between and the cache reloads what changed.
        if state.loaded_generation == before:
            with self._cache_lock:
                state.apply(loaded, removed)
                state.loaded_generation = generation
                state.unsnapshotted += sum(len(item.rows) for item in loaded) + len(removed)
            self._snapshot_if_due(state)
            return
        try:
            self._refresh(state)
        except RetrievalError:
            # The write is committed: failing it now would invite a retry of a done mutation.
            # The next search retries the reload instead.
            state.loaded_generation = -1
            _log.warning("cache reload after a commit failed; retried on the next search")

    def _refresh(self, state: CorpusState) -> None:
        """Bring one corpus's cache up to date from SQLite, loading only changed sources.

        Caller holds the db lock. The listing and the loads share one read transaction, so the
        cache moves from one committed state to another.
        """
        corpus = state.descriptor.corpus_id
        conn = self._connection()
        with translated("loading the corpus"), transaction(conn, "BEGIN"):
            row = conn.execute(
                "SELECT generation FROM corpora WHERE corpus_id = ?", (corpus,)
            ).fetchone()
            generation = int(row[0]) if row is not None else 0
            listing = {
                (str(ns), str(sid)): (int(pk), int(gen), int(count))
                for pk, ns, sid, gen, count in conn.execute(
                    "SELECT id, namespace, source_id, generation, chunk_count FROM sources "
                    "WHERE corpus_id = ?",
                    (corpus,),
                )
            }
            removed = [key for key in state.generations if key not in listing]
            changed = [
                (pk, count)
                for key, (pk, gen, count) in listing.items()
                if state.generations.get(key) != gen
            ]
            # The first load of a corpus (no search can read it before `loaded_generation` is
            # set, under this same lock) goes in batches: the passages' parsed term
            # frequencies are transient, and all of them at once would leave the heap
            # several times the size of the index. Later reloads apply in one step, so a
            # search sees the cache before or after them.
            batches = [changed]
            if state.loaded_generation < 0:
                batches = list(_batches(changed, LOAD_BATCH_ROWS))
            for number, batch in enumerate(batches):
                loaded = self._load_batch(conn, state.dimensions, batch)
                gone = removed if number == 0 else []
                with self._cache_lock:
                    state.apply(loaded, gone)
                    state.unsnapshotted += sum(len(item.rows) for item in loaded) + len(gone)
                del loaded
            if not batches:
                with self._cache_lock:
                    state.apply([], removed)
                    state.unsnapshotted += len(removed)
        with self._cache_lock:
            state.loaded_generation = generation

    @staticmethod
    def _load_batch(conn: apsw.Connection, dims: int, batch: list[tuple[int, int]]) -> list[Loaded]:
        """These source revisions (primary key, passage count) read from SQLite."""
        # One staging array for the batch's vectors, freed whole once they are copied into
        # the index: thousands of small per-source arrays interleaved with the passages'
        # long-lived objects would leave the heap fragmented, resident for good.
        staging = np.empty((sum(c for _, c in batch), dims), dtype=np.float32)
        loaded: list[Loaded] = []
        at = 0
        for pk, count in batch:
            loaded.append(load_revision(conn, dims, pk, staging[at : at + count]))
            at += count
        return loaded

    # --- helpers -------------------------------------------------------------------------------

    def _connection(self) -> apsw.Connection:
        if self._conn is None:
            raise closed()
        return self._conn

    def _state(self, corpus: str) -> CorpusState:
        # One dict read, atomic without the lock (entries are added under it, and all cleared
        # at close): a search on the event loop must not wait here for a writer's commit.
        state = self._corpora.get(corpus)
        if state is None:
            self._connection()  # a closed store says so first
            raise corpus_not_open(corpus)
        return state

    # --- inspection (`adapters/sqlite/inspect.py`) ---------------------------------------------

    @contextlib.contextmanager
    def _inspecting(self, corpus: str, doing: str) -> Iterator[tuple[apsw.Connection, int]]:
        dims = self._state(corpus).dimensions  # an unopened corpus or a closed store says so
        with self._db_lock, translated(doing):
            yield self._connection(), dims

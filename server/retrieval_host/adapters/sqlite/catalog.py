"""The SQLite store's catalog: a corpus's stored descriptor (written at its first open), the
commit times of current revisions, and the per-thread read-only connection that reads them
and the freshness check."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Collection
from pathlib import Path

import apsw

from retrieval_host.adapters._store_rules import check_descriptor
from retrieval_host.adapters.sqlite.schema import (
    BUSY_TIMEOUT_MS,
    check_not_orphaned,
    open_database,
    read_only_target,
    translated,
)
from retrieval_host.adapters.sqlite.tables import IDENTITY, backfill_terms
from retrieval_host.core.descriptor import CorpusDescriptor


def peek_descriptors(
    path: str | os.PathLike[str], trusted_groups: frozenset[int] = frozenset()
) -> dict[str, str]:
    """Corpus id -> the descriptor stored for it (canonical JSON) in the store at `path`, read
    without writing anything (no file is made, nothing migrated); {} when there is no store
    yet. Raises what opening the store would: `UNSAFE_STORE` for an unsafe location, another
    application's or a newer release's database. A start checks this before the run records
    or this store are migrated, which the release that wrote them then refuses
    (`adapters.wiring.check_vector_store`)."""
    if not os.path.lexists(path):
        check_not_orphaned(Path(path))  # the open would refuse it
        return {}
    conn, _ = open_database(path, IDENTITY, trusted_groups, read_only=True, earlier=True)
    try:
        with translated("reading the corpus descriptors"):
            if (
                conn.execute(
                    "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'corpora'"
                ).fetchone()
                is None
            ):
                return {}  # an empty file: the open makes the schema
            rows = conn.execute("SELECT corpus_id, descriptor_json FROM corpora").fetchall()
            return {str(corpus): str(stored) for corpus, stored in rows}
    finally:
        conn.close()


def read_descriptor(conn: apsw.Connection, corpus: str) -> str | None:
    """The descriptor the corpus's first open stored (canonical JSON), or None."""
    row = conn.execute(
        "SELECT descriptor_json FROM corpora WHERE corpus_id = ?", (corpus,)
    ).fetchone()
    return None if row is None else str(row[0])


def store_descriptor(conn: apsw.Connection, descriptor: CorpusDescriptor) -> int:
    """In the caller's write transaction: store the descriptor of a new corpus, or check it
    against the stored one (`DESCRIPTOR_MISMATCH`) and analyze, once, the passages a corpus
    from before the lexical index stored without terms. Returns how many were analyzed."""
    stored = read_descriptor(conn, descriptor.corpus_id)
    if stored is None:
        conn.execute(
            "INSERT INTO corpora (corpus_id, descriptor_json) VALUES (?, ?)",
            (descriptor.corpus_id, descriptor.canonical_json()),
        )
        return 0
    check_descriptor(descriptor, stored)
    return backfill_terms(conn, descriptor.corpus_id)


def read_indexed_at(
    conn: apsw.Connection, corpus: str, namespace: str, source_ids: Collection[str]
) -> dict[str, tuple[str, str | None]]:
    """Source id -> (current revision, commit time) for the ids that exist: one statement."""
    ids = list(dict.fromkeys(source_ids))
    if not ids:
        return {}
    rows = conn.execute(
        "SELECT source_id, revision, indexed_at FROM sources WHERE corpus_id = ? "
        "AND namespace = ? AND source_id IN (SELECT value FROM json_each(?))",
        (corpus, namespace, json.dumps(ids)),
    ).fetchall()
    return {str(s): (str(r), None if t is None else str(t)) for s, r, t in rows}


def open_reader(path: Path, *, immutable: bool = False) -> apsw.Connection:
    """A read-only connection to the store at `path`, set up as the store's own (`immutable`:
    a read-only store on a volume that cannot be written, `schema.opens_immutable`)."""
    name, flags = read_only_target(path, immutable=immutable)
    conn = apsw.Connection(name, flags=flags)
    try:
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        conn.execute("PRAGMA trusted_schema=OFF")
        conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
    except BaseException:
        conn.close()
        raise
    return conn


class Readers:
    """Per-thread read-only connections to one store file (opened on first use by each
    thread), closed all together with the store."""

    def __init__(self, path: Path, *, immutable: bool = False) -> None:
        self._path = path
        self._immutable = immutable
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[apsw.Connection] = []
        self._closed = False

    @property
    def opened(self) -> int:
        """How many threads hold a connection (open ones)."""
        with self._lock:
            return len(self._opened)

    def get(self) -> apsw.Connection | None:
        """This thread's connection; None once the store is closed."""
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._closed:
            self._local.conn = None
            conn.close()  # in use when the store closed: its thread closes it now
            return None
        if conn is not None:
            return conn
        with self._lock:
            if self._closed:
                return None
            # A database file removed under the host cannot be opened: `STORE_UNAVAILABLE`,
            # as for the writes (it was an untyped 500 for the first search of a thread).
            with translated("opening the database to read"):
                conn = open_reader(self._path, immutable=self._immutable)
            self._opened.append(conn)
        self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every thread's connection. One another thread is reading on cannot be closed
        from here (apsw raises `ThreadingViolationError`: a black-box test's close under load
        stopped there, leaving the store half closed): its thread closes it at its next read,
        which then finds the store closed."""
        with self._lock:
            self._closed = True
            for conn in self._opened:
                with contextlib.suppress(apsw.ThreadingViolationError):
                    conn.close()
            self._opened.clear()

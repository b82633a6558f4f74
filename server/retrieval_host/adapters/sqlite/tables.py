"""The vector store's tables in SQLite: their schema, and the statements the store runs on them
beyond plain reads (the replacement checks, the corpus generation, loading one revision)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, Final

import apsw
import numpy as np

from retrieval_host.adapters._media_type_backfill import (
    INGESTED_MEDIA_TYPES,
    Candidate,
    Passage,
    Window,
    fill_media_types,
)
from retrieval_host.adapters._store_rules import (
    capacity_exceeded,
    check_expected_revision,
    chunk_id_taken,
    corpus_missing,
    terms_json,
)
from retrieval_host.adapters.sqlite.scan import Matrix, check_stored
from retrieval_host.adapters.sqlite.schema import Identity, one, translated
from retrieval_host.adapters.sqlite.segment import Loaded, Revision
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1, term_frequencies
from retrieval_host.core.models import Location
from retrieval_host.core.ports import CapacityLimits
from retrieval_host.core.reasons import StoreUnavailableReason

APPLICATION_ID: Final = 0x52485653  # "RHVS": retrieval-host vector store
SCHEMA_VERSION: Final = 5

# The passages still without term frequencies (see `backfill_terms`): normally none, so the
# check at every corpus open reads this empty index instead of every passage (1.2 GB at 300k
# passages, most of the open once the index is mapped from its snapshot).
_WITHOUT_TERMS: Final = (
    "CREATE INDEX chunks_without_terms ON chunks (corpus_id) WHERE terms IS NULL"
)
_SCHEMA: Final = (
    """CREATE TABLE corpora (
        corpus_id TEXT PRIMARY KEY,
        descriptor_json TEXT NOT NULL,
        generation INTEGER NOT NULL DEFAULT 0
    ) STRICT""",
    """CREATE TABLE sources (
        id INTEGER PRIMARY KEY,
        corpus_id TEXT NOT NULL REFERENCES corpora(corpus_id),
        namespace TEXT NOT NULL,
        source_id TEXT NOT NULL,
        revision TEXT NOT NULL,
        title TEXT NOT NULL,
        metadata_json TEXT NOT NULL,
        document_sha256 TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        chunk_count INTEGER NOT NULL,
        payload_bytes INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        media_type TEXT,
        indexed_at TEXT,
        UNIQUE (corpus_id, namespace, source_id)
    ) STRICT""",
    """CREATE TABLE chunks (
        source_pk INTEGER NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
        corpus_id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        chunk_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        text TEXT NOT NULL,
        page INTEGER,
        start_line INTEGER,
        end_line INTEGER,
        document_id TEXT,
        vector BLOB NOT NULL,
        terms TEXT,
        UNIQUE (corpus_id, namespace, chunk_id),
        UNIQUE (source_pk, ordinal)
    ) STRICT""",
    _WITHOUT_TERMS,
)
# Version 1 had no lexical index. `chunks.terms`: the passage's term frequencies as a JSON
# object (`core.lexical`), written with the vector. NULL in a database of schema version 1
# until `backfill_terms` computes it from the stored text at the corpus's next open; a NULL is
# also analyzed at load, so the index never misses a passage.
# Version 2 recorded no media type and commit time (NULL for the sources it holds).
# Version 3 had no index of the passages without terms (built once, by the migration).
# Version 4 kept NULL the media type of the sources written before version 3 (a black-box
# probe: `mediaType: null`, hidden by the media-type filter, kept by an `unchanged` re-ingest).
# Ingestion also wrote the type into the source's metadata, and `_fill_media_types` reads it
# back from there for ingested sources only (`adapters._media_type_backfill` says which: every
# passage id the one ingestion derives for it). The previous main decided by the ids' shape in
# SQL and so also typed prepared sources with ids of that shape (probe U, session 42); a store
# it migrated keeps what it set (a re-index through the index API resets it to NULL).
_SOURCE_WINDOW: Final = (  # the last column: whether the source is a candidate
    "SELECT id, source_id, revision, metadata_json ->> '$.mediaType', chunk_count, "
    "media_type IS NULL AND metadata_json ->> '$.mediaType' IN (SELECT value FROM json_each(?)) "
    "FROM sources WHERE id > ? ORDER BY id LIMIT ?"
)


def _fill_media_types(conn: apsw.Connection) -> None:
    """The media-type backfill of version 4 -> 5, inside the migration's transaction. Linear:
    it reads every candidate passage's text once (`fill_media_types`)."""
    kinds = json.dumps(INGESTED_MEDIA_TYPES)

    def window(after: int, limit: int) -> Window:
        rows: list[tuple[Any, ...]] = conn.execute(_SOURCE_WINDOW, (kinds, after, limit)).fetchall()
        found = [
            Candidate(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4])) for r in rows if r[5]
        ]
        return found, int(rows[-1][0]) if rows else None

    def passages(keys: Sequence[int]) -> Iterator[Passage]:
        # Streamed: nothing else runs on the connection until the batch is read.
        rows: apsw.Cursor = conn.execute(
            "SELECT source_pk, ordinal, chunk_id, text FROM chunks "
            "WHERE source_pk IN (SELECT value FROM json_each(?))",
            (json.dumps(list(keys)),),
        )
        row: tuple[Any, ...]
        for row in rows:
            yield int(row[0]), int(row[1]), str(row[2]), str(row[3])

    def record(found: Sequence[tuple[str, int]]) -> None:
        conn.executemany("UPDATE sources SET media_type = ? WHERE id = ?", found)

    fill_media_types(window, passages, record)


_MIGRATIONS: Final = {
    1: ("ALTER TABLE chunks ADD COLUMN terms TEXT",),
    2: (
        "ALTER TABLE sources ADD COLUMN media_type TEXT",
        "ALTER TABLE sources ADD COLUMN indexed_at TEXT",
    ),
    3: (_WITHOUT_TERMS,),
    4: (_fill_media_types,),
}
IDENTITY: Final = Identity(
    APPLICATION_ID,
    SCHEMA_VERSION,
    frozenset({"corpora", "sources", "chunks"}),
    _SCHEMA,
    _MIGRATIONS,
    "vector store",
)


def committed_generation(conn: apsw.Connection, corpus: str) -> int | None:
    """The corpus's committed generation (None when it has no row), read to the end so that
    no read transaction stays open."""
    with translated("reading the corpus generation"):
        rows = conn.execute(
            "SELECT generation FROM corpora WHERE corpus_id = ?", (corpus,)
        ).fetchall()
    value = rows[0][0] if rows else None
    return value if isinstance(value, int) else None


def check_replacement(
    conn: apsw.Connection,
    key: tuple[str, str, str],
    expected_revision: str | None,
    chunk_ids: list[str],
    payload: int,
    limits: CapacityLimits,
) -> int | None:
    """The checks of `replace_source`, inside its transaction; returns the current row id."""
    corpus, namespace, _ = key
    current = conn.execute(
        "SELECT id, revision, generation FROM sources "
        "WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
        key,
    ).fetchone()
    current_pk = int(current[0]) if current is not None else None
    if current is None:
        check_expected_revision(None, None, expected_revision)
    else:  # the version is the generation (`_store_rules.stored_source`)
        check_expected_revision(str(current[1]), str(current[2]), expected_revision)
    taken = conn.execute(
        "SELECT 1 FROM chunks WHERE corpus_id = ? AND namespace = ? AND source_pk IS NOT ? "
        "AND chunk_id IN (SELECT value FROM json_each(?)) LIMIT 1",
        (corpus, namespace, current_pk, json.dumps(chunk_ids)),
    ).fetchone()
    if taken is not None:
        raise chunk_id_taken()
    used = one(
        conn.execute(
            "SELECT COALESCE(SUM(payload_bytes), 0) FROM sources "
            "WHERE corpus_id = ? AND id IS NOT ?",
            (corpus, current_pk),
        )
    )[0]
    if int(used) + payload > limits.max_corpus_payload_bytes:
        raise capacity_exceeded(limits)
    return current_pk


def bump_generation(conn: apsw.Connection, corpus: str) -> tuple[int, int]:
    row = conn.execute(
        "UPDATE corpora SET generation = generation + 1 WHERE corpus_id = ? RETURNING generation",
        (corpus,),
    ).fetchone()
    if row is None:
        raise corpus_missing(corpus)
    generation = int(row[0])
    return generation - 1, generation


def load_revision(conn: apsw.Connection, dims: int, source_pk: int, out: Matrix) -> Loaded:
    """One source revision, its unit vectors written into `out` (a slice of staging)."""
    row = one(
        conn.execute(
            "SELECT namespace, source_id, revision, document_sha256, metadata_json, "
            "generation, media_type FROM sources WHERE id = ?",
            (source_pk,),
        )
    )
    chunks: list[tuple[Any, ...]] = conn.execute(
        "SELECT chunk_id, CAST(text AS BLOB), page, start_line, end_line, document_id, "
        "vector, terms FROM chunks WHERE source_pk = ? ORDER BY ordinal",
        (source_pk,),
    ).fetchall()
    width = dims * 4
    if len(chunks) != len(out) or any(len(c[6]) != width for c in chunks):
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "a stored vector does not have the corpus dimensions.",
            reason=StoreUnavailableReason.CORRUPT_VECTOR,
        )
    if chunks:
        out[:] = np.frombuffer(b"".join(c[6] for c in chunks), dtype="<f4").reshape(len(chunks), -1)
        out /= check_stored(out)  # our own staging rows, normalised in place
    rows = tuple((str(c[0]), bytes(c[1]), Location(c[2], c[3], c[4], c[5])) for c in chunks)
    terms = tuple(
        term_frequencies(bytes(c[1]).decode("utf-8"), ANALYZER_EN_SNOWBALL_1)
        if c[7] is None
        else json.loads(str(c[7]))
        for c in chunks
    )
    return Loaded(
        str(row[0]),
        Revision(
            str(row[1]),
            str(row[2]),
            str(row[3]),
            json.loads(str(row[4])),
            int(row[5]),
            None if row[6] is None else str(row[6]),
        ),
        rows,
        out,
        terms,
    )


def backfill_terms(conn: apsw.Connection, corpus: str) -> int:
    """Store the term frequencies of a corpus's passages written before the lexical index
    (schema version 1), analyzed from their stored text; no vector is touched. Runs inside
    the caller's write transaction; returns the number of passages analyzed."""
    pending = conn.execute(
        "SELECT rowid, text FROM chunks WHERE corpus_id = ? AND terms IS NULL", (corpus,)
    ).fetchall()
    conn.executemany(
        "UPDATE chunks SET terms = ? WHERE rowid = ?",
        [
            (terms_json(term_frequencies(str(text), ANALYZER_EN_SNOWBALL_1)), rowid)
            for rowid, text in pending
        ],
    )
    return len(pending)

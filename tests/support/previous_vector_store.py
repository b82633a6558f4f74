"""Vector stores as earlier releases wrote them: before the lexical index (schema version 1),
and with it but before sources recorded their media type and commit time (version 2).

The DDL is copied from that release (main at cbc955d: `adapters/sqlite/tables.py` and
`adapters/postgres/schema.py`), and the rows are written as its `replace_source` wrote them:
no term frequencies, and a corpus descriptor without the `lexical` field. Frozen here so that
the migration tests keep testing the real old layout after the code moves on. Version 2 is
version 1 brought forward as that release did at open: its migration statements (copied from
main at 1e3b288) and then its analysis of the stored text, which this release still runs
unchanged (`backfill_terms`, `lexical.backfill`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import apsw
import numpy as np
import psycopg
from psycopg import sql

from retrieval_host.adapters.postgres import lexical
from retrieval_host.adapters.sqlite.tables import backfill_terms
from retrieval_host.core.descriptor import CorpusDescriptor

SQLITE_VECTOR_APPLICATION_ID: Final = 0x52485653
SQLITE_VECTOR_SCHEMA_V1: Final = (
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
        UNIQUE (corpus_id, namespace, chunk_id),
        UNIQUE (source_pk, ordinal)
    ) STRICT""",
)

PG_VECTOR_SCHEMA_V1: Final = (
    "CREATE TABLE {s}.schema_version (component text PRIMARY KEY, version integer NOT NULL)",
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
    "INSERT INTO {s}.schema_version VALUES ('vector-store', 1)",
)

# The lexical index's migration, version 1 -> 2, of each store.
SQLITE_LEXICAL_MIGRATION: Final = ("ALTER TABLE chunks ADD COLUMN terms TEXT",)
PG_LEXICAL_MIGRATION: Final = (
    "ALTER TABLE {s}.chunks ADD COLUMN term_count integer",
    """CREATE TABLE {s}.lexical_spaces (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        corpus_id text NOT NULL REFERENCES {s}.corpora (corpus_id),
        namespace text NOT NULL,
        passages bigint NOT NULL DEFAULT 0 CHECK (passages >= 0),
        total_terms bigint NOT NULL DEFAULT 0 CHECK (total_terms >= 0),
        CONSTRAINT lexical_spaces_key UNIQUE (corpus_id, namespace)
    )""",
    """CREATE TABLE {s}.chunk_terms (
        space_pk bigint NOT NULL REFERENCES {s}.lexical_spaces (id),
        term text COLLATE "C" NOT NULL,
        chunk_pk bigint NOT NULL REFERENCES {s}.chunks (id) ON DELETE CASCADE,
        tf integer NOT NULL CHECK (tf > 0),
        PRIMARY KEY (space_pk, term, chunk_pk)
    )""",
    "CREATE INDEX chunk_terms_chunk ON {s}.chunk_terms (chunk_pk)",
)

# (namespace, source id) -> passage texts; revision "r1", one random unit vector per passage.
OldCorpus = Mapping[tuple[str, str], Sequence[str]]


def previous_descriptor_json(descriptor: CorpusDescriptor) -> str:
    """The descriptor as the previous release stored it (no `lexical` field)."""
    body = json.loads(descriptor.canonical_json())
    del body["lexical"]
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def old_vectors(source_id: str, count: int, dims: int) -> np.typing.NDArray[np.float32]:
    """The unit vectors stored for a source's passages (random, seeded by the source id)."""
    seed = int.from_bytes(hashlib.sha256(source_id.encode()).digest()[:8], "big")
    raw = np.random.default_rng(seed).standard_normal((count, dims))
    unit: np.typing.NDArray[np.float32] = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def _digest(texts: Sequence[str]) -> str:
    return hashlib.sha256("\n\n".join(texts).encode()).hexdigest()


def sqlite_v1_database(path: Path, descriptor: CorpusDescriptor, corpus: OldCorpus) -> None:
    """A SQLite vector store file of schema version 1 holding `corpus` at revision r1."""
    dims = descriptor.embedding.dimensions
    path.touch(mode=0o600)
    db = apsw.Connection(str(path))
    try:
        with db:
            for statement in SQLITE_VECTOR_SCHEMA_V1:
                db.execute(statement)
            db.execute(f"PRAGMA application_id={SQLITE_VECTOR_APPLICATION_ID}")
            db.execute("PRAGMA user_version=1")
            db.execute(
                "INSERT INTO corpora VALUES (?, ?, ?)",
                (descriptor.corpus_id, previous_descriptor_json(descriptor), len(corpus)),
            )
            for generation, ((namespace, source_id), texts) in enumerate(corpus.items(), 1):
                vectors = old_vectors(source_id, len(texts), dims)
                payload = sum(len(t.encode()) for t in texts) + len(texts) * dims * 4
                source_pk = db.execute(
                    "INSERT INTO sources (corpus_id, namespace, source_id, revision, title, "
                    "metadata_json, document_sha256, fingerprint, chunk_count, payload_bytes, "
                    "generation) VALUES (?, ?, ?, 'r1', ?, '{}', ?, ?, ?, ?, ?) RETURNING id",
                    (
                        descriptor.corpus_id,
                        namespace,
                        source_id,
                        f"Title of {source_id}",
                        _digest(texts),
                        _digest([source_id, *texts]),
                        len(texts),
                        payload,
                        generation,
                    ),
                ).fetchall()[0][0]
                for i, text in enumerate(texts):
                    db.execute(
                        "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, NULL, ?)",
                        (
                            source_pk,
                            descriptor.corpus_id,
                            namespace,
                            f"{source_id}:{i}",
                            i,
                            text,
                            i + 1,
                            i + 1,
                            vectors[i].astype("<f4").tobytes(),
                        ),
                    )
    finally:
        db.close()


def pg_v1_schema(dsn: str, schema: str, descriptor: CorpusDescriptor, corpus: OldCorpus) -> None:
    """A PostgreSQL schema as the previous release created it, holding `corpus` at r1."""
    dims = descriptor.embedding.dimensions
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for statement in PG_VECTOR_SCHEMA_V1:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
        s = sql.Identifier(schema)
        payload_total = sum(
            sum(len(t.encode()) for t in texts) + len(texts) * dims * 4 for texts in corpus.values()
        )
        conn.execute(
            sql.SQL("INSERT INTO {}.corpora VALUES (%s, %s, %s, %s)").format(s),
            (descriptor.corpus_id, previous_descriptor_json(descriptor), dims, payload_total),
        )
    pg_v1_write(dsn, schema, descriptor, corpus)


def pg_v1_write(dsn: str, schema: str, descriptor: CorpusDescriptor, corpus: OldCorpus) -> None:
    """Write `corpus` at r1 as a replica of that release does (no terms, no statistics): into
    its own schema, or one a newer replica has migrated while it still serves."""
    dims = descriptor.embedding.dimensions
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (namespace, source_id), texts in corpus.items():
            vectors = old_vectors(source_id, len(texts), dims)
            payload = sum(len(t.encode()) for t in texts) + len(texts) * dims * 4
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.sources (corpus_id, namespace, source_id, revision, title, "
                    "metadata_json, metadata, document_sha256, fingerprint, chunk_count, "
                    "payload_bytes) VALUES (%s, %s, %s, 'r1', %s, '{{}}', '{{}}'::jsonb, %s, "
                    "%s, %s, %s) RETURNING id"
                ).format(s),
                (
                    descriptor.corpus_id,
                    namespace,
                    source_id,
                    f"Title of {source_id}",
                    _digest(texts),
                    _digest([source_id, *texts]),
                    len(texts),
                    payload,
                ),
            ).fetchone()
            assert row is not None
            for i, text in enumerate(texts):
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.chunks (source_pk, corpus_id, namespace, chunk_id, "
                        "ordinal, text, page, start_line, end_line, document_id, dimensions, "
                        "embedding) VALUES (%s, %s, %s, %s, %s, %s, 1, %s, %s, NULL, %s, "
                        "%s::vector)"
                    ).format(s),
                    (
                        row[0],
                        descriptor.corpus_id,
                        namespace,
                        f"{source_id}:{i}",
                        i,
                        text,
                        i + 1,
                        i + 1,
                        dims,
                        "[" + ",".join(repr(float(x)) for x in vectors[i]) + "]",
                    ),
                )


def sqlite_v2_database(path: Path, descriptor: CorpusDescriptor, corpus: OldCorpus) -> None:
    """A SQLite vector store file of schema version 2 (the lexical index, every passage's terms
    stored) holding `corpus` at revision r1: version 1 migrated and its corpus opened."""
    sqlite_v1_database(path, descriptor, corpus)
    db = apsw.Connection(str(path))
    try:
        with db:
            for statement in SQLITE_LEXICAL_MIGRATION:
                db.execute(statement)
            db.execute("PRAGMA user_version=2")
            backfill_terms(db, descriptor.corpus_id)
    finally:
        db.close()


def pg_v2_schema(dsn: str, schema: str, descriptor: CorpusDescriptor, corpus: OldCorpus) -> None:
    """A PostgreSQL schema of `vector-store` version 2 (the lexical index built) holding
    `corpus` at r1: version 1 migrated in one transaction, as that release did at open."""
    pg_v1_schema(dsn, schema, descriptor, corpus)
    with psycopg.connect(dsn) as conn, conn.transaction():
        for statement in PG_LEXICAL_MIGRATION:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
        lexical.backfill(conn, schema, 1)
        conn.execute(
            sql.SQL(
                "UPDATE {}.schema_version SET version = 2 WHERE component = 'vector-store'"
            ).format(sql.Identifier(schema))
        )

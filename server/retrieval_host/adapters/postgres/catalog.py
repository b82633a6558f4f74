"""The PostgreSQL store's catalog reads: a corpus's stored descriptor, the current revision of
each source, and when it was committed. One statement each, on the caller's connection."""

from __future__ import annotations

from collections.abc import Collection

from psycopg import Connection

from retrieval_host.adapters.postgres.pool import (
    ConnectionPool,
    answer_timeout_s,
    transaction,
    translated,
)
from retrieval_host.adapters.postgres.schema import (
    check_schema_name,
    ensure_vector_schema,
    schema_sql,
    session_setup,
)
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason

_TIMEOUT_MS = 30_000


def peek_descriptors(dsn: str, schema: str) -> dict[str, str]:
    """Corpus id -> the descriptor stored for it (canonical JSON) in `schema`, read in a
    read-only session (nothing is created or migrated); {} when the schema holds no vector
    store yet. Raises what opening the store would for a schema that is not ours or of a newer
    release (`UNSAFE_STORE`), so a start refuses before the run records or this store are
    migrated, which the release that wrote them then refuses
    (`adapters.wiring.check_vector_store`). A database without the pgvector extension holds
    no store either: the writable open creates both (a read-only session may not)."""
    check_schema_name(schema)
    pool = ConnectionPool(
        dsn, 1, session_setup(_TIMEOUT_MS, True), answer_timeout_s=answer_timeout_s(_TIMEOUT_MS)
    )
    try:
        with pool.connection() as conn:
            try:
                ensure_vector_schema(conn, schema, read_only=True)
            except RetrievalError as exc:
                if exc.reason == StoreUnavailableReason.MISSING_STORE:
                    return {}  # the open creates it
                if exc.code is not ErrorCode.STORE_READ_ONLY:
                    raise  # not ours, or newer
                # An earlier version: the open migrates it; its descriptors are read as stored.
            with translated("reading the corpus descriptors"), transaction(conn, read_only=True):
                rows = conn.execute(
                    schema_sql(schema, "SELECT corpus_id, descriptor_json FROM {s}.corpora")
                ).fetchall()
        return {str(corpus): str(stored) for corpus, stored in rows}
    except RetrievalError as exc:
        if exc.reason == StoreUnavailableReason.PGVECTOR_MISSING:
            return {}  # refused by the read-only session's setup: the open creates it
        raise
    finally:
        pool.close()


def read_descriptor(conn: Connection, schema: str, corpus: str) -> str | None:
    """The descriptor the corpus's first open stored (canonical JSON), or None."""
    row = conn.execute(
        schema_sql(schema, "SELECT descriptor_json FROM {s}.corpora WHERE corpus_id = %s"),
        (corpus,),
    ).fetchone()
    return None if row is None else str(row[0])


def read_revisions(
    conn: Connection, schema: str, corpus: str, namespace: str, ids: list[str] | None
) -> dict[str, str]:
    """Source id -> current revision in one namespace (all its sources when `ids` is None),
    over the sources' unique (corpus, namespace, source id) index."""
    if ids is None:
        rows = conn.execute(
            schema_sql(
                schema,
                "SELECT source_id, revision FROM {s}.sources "
                "WHERE corpus_id = %s AND namespace = %s ORDER BY source_id",
            ),
            (corpus, namespace),
        ).fetchall()
    else:
        rows = conn.execute(
            schema_sql(
                schema,
                "SELECT source_id, revision FROM {s}.sources WHERE corpus_id = %s "
                "AND namespace = %s AND source_id = ANY(%s) ORDER BY source_id",
            ),
            (corpus, namespace, ids),
        ).fetchall()
    return {str(sid): str(revision) for sid, revision in rows}


def read_indexed_at(
    conn: Connection, schema: str, corpus: str, namespace: str, ids: Collection[str]
) -> dict[str, tuple[str, str | None]]:
    """Source id -> (current revision, commit time) for the ids that exist."""
    rows = conn.execute(
        schema_sql(
            schema,
            "SELECT source_id, revision, indexed_at FROM {s}.sources WHERE "
            "corpus_id = %s AND namespace = %s AND source_id = ANY(%s)",
        ),
        (corpus, namespace, list(ids)),
    ).fetchall()
    return {str(s): (str(r), None if t is None else str(t)) for s, r, t in rows}

"""The PostgreSQL store's catalog reads: a corpus's stored descriptor, the current revision of
each source, and when it was committed. One statement each, on the caller's connection."""

from __future__ import annotations

from collections.abc import Collection

from psycopg import Connection

from retrieval_host.adapters.postgres.schema import schema_sql


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

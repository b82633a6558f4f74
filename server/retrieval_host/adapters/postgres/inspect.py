"""Inspection reads of the PostgreSQL store (`VectorStore.list_sources` and the rest).

Each is one statement (one snapshot), but `read_passage`: two in one REPEATABLE READ
transaction, its grant asked between them. A grant is passed as two arrays joined with `unnest`,
plus `source_id = ANY(...)` so the unique (corpus, namespace, source id) index finds the granted
sources: the cost follows the grant, not the namespace (as `search.Searcher`). Source ids order
by `COLLATE "C"`: byte order of UTF-8, i.e. code point order, as SQLite and Python order them,
whatever the database's collation. Text holding NUL cannot be stored, so such ids match nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping

from retrieval_host.adapters._inspection_rows import (
    FIRST_ORDINAL,
    FIRST_SOURCE_ID,
    LISTED_SOURCE_COLUMNS,
    PASSAGE_COLUMNS,
    READ_PASSAGE_COLUMNS,
    TOTAL_COLUMNS,
    listed_passage,
    listed_source,
    totals,
)
from retrieval_host.adapters.postgres.pool import Connection, transaction
from retrieval_host.adapters.postgres.schema import schema_sql
from retrieval_host.core.inspection import (
    PassageSummary,
    SourceSummary,
    SourceTotals,
    StoredPassage,
)
from retrieval_host.core.models import Location

_GRANTED = (
    "FROM {s}.sources s JOIN unnest(%s::text[], %s::text[]) AS g (source_id, revision) "
    "ON s.source_id = g.source_id AND s.revision = g.revision "
    "WHERE s.corpus_id = %s AND s.namespace = %s AND s.source_id = ANY(%s::text[])"
)
_PASSAGE = (
    "FROM {s}.chunks c JOIN {s}.sources s ON s.id = c.source_pk "
    "WHERE c.corpus_id = %s AND c.namespace = %s AND c.chunk_id = %s"
)


def _no_nul(*values: str) -> bool:
    return not any("\x00" in v for v in values)


def _grant(allowed: Mapping[str, str]) -> tuple[list[str], list[str]]:
    pairs = [(s, r) for s, r in allowed.items() if _no_nul(s, r)]
    return [s for s, _ in pairs], [r for _, r in pairs]


def list_sources(
    conn: Connection,
    schema: str,
    dimensions: int,
    key: tuple[str, str],
    allowed: Mapping[str, str],
    after: str | None,
    limit: int,
) -> list[SourceSummary]:
    ids, revisions = _grant(allowed)
    after = after or FIRST_SOURCE_ID
    if not ids or not _no_nul(*key, after):
        return []
    # The version of the write is the row id, as every write inserts a row (`stored_source`).
    rows = conn.execute(
        schema_sql(
            schema,
            f"SELECT {LISTED_SOURCE_COLUMNS}, s.id {_GRANTED} "
            'AND s.source_id COLLATE "C" > %s ORDER BY s.source_id COLLATE "C" LIMIT %s',
        ),
        (ids, revisions, *key, ids, after, limit),
        prepare=False,
    ).fetchall()
    return [listed_source(row, dimensions) for row in rows]


def source_totals(
    conn: Connection,
    schema: str,
    dimensions: int,
    key: tuple[str, str],
    allowed: Mapping[str, str],
) -> SourceTotals:
    ids, revisions = _grant(allowed)
    if not ids or not _no_nul(*key):
        return SourceTotals()
    row = conn.execute(
        schema_sql(schema, f"SELECT {TOTAL_COLUMNS} {_GRANTED}"),
        (ids, revisions, *key, ids),
        prepare=False,
    ).fetchone()
    return SourceTotals() if row is None else totals(row, dimensions)


def list_passages(
    conn: Connection,
    schema: str,
    key: tuple[str, str, str, str],
    after: int | None,
    limit: int,
) -> list[PassageSummary]:
    if not _no_nul(*key):
        return []
    rows = conn.execute(
        schema_sql(
            schema,
            f"SELECT {PASSAGE_COLUMNS}, octet_length(c.text) "  # noqa: S608 - constant SQL
            "FROM {s}.sources s JOIN {s}.chunks c ON c.source_pk = s.id "
            "WHERE s.corpus_id = %s AND s.namespace = %s AND s.source_id = %s "
            "AND s.revision = %s AND c.ordinal > %s ORDER BY c.ordinal LIMIT %s",
        ),
        (*key, FIRST_ORDINAL if after is None else after, limit),
    ).fetchall()
    return [listed_passage(row) for row in rows]


def read_passage(
    conn: Connection,
    schema: str,
    key: tuple[str, str, str],
    readable: Callable[[str, str], bool],
) -> StoredPassage | None:
    if not _no_nul(*key):
        return None
    # The text and metadata are read only once the grant allows them: reading and decoding a
    # hidden source's made its chunk ids answer slower than missing ones (a black-box probe).
    # One snapshot, so a write committed between the two reads cannot come between them.
    with transaction(conn, repeatable_read=True, read_only=True):
        pair = conn.execute(
            schema_sql(schema, f"SELECT s.source_id, s.revision {_PASSAGE}"), key
        ).fetchone()
        if pair is None or not readable(str(pair[0]), str(pair[1])):
            return None
        row = conn.execute(
            schema_sql(
                schema,
                f"SELECT {READ_PASSAGE_COLUMNS}, s.media_type {_PASSAGE} "
                "AND s.source_id = %s AND s.revision = %s",
            ),
            (*key, *pair),
        ).fetchone()
    if row is None:
        return None
    chunk_id, source_id, revision, text, page, start, end, document_id, digest, meta = row[:10]
    return StoredPassage(
        str(chunk_id),
        str(source_id),
        str(revision),
        str(text),
        Location(
            None if page is None else int(page),
            None if start is None else int(start),
            None if end is None else int(end),
            document_id,
        ),
        str(digest),
        json.loads(str(meta)),
        None if row[10] is None else str(row[10]),
    )


class PgInspection:
    """The inspection methods of `PgVectorStore`, over what its `_inspecting` yields: a pooled
    connection (errors translated), the store's schema and the corpus's dimensions."""

    def _inspecting(
        self, corpus: str, doing: str
    ) -> contextlib.AbstractContextManager[tuple[Connection, str, int]]:
        raise NotImplementedError

    def list_sources(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        *,
        after: str | None,
        limit: int,
    ) -> list[SourceSummary]:
        """The allowed sources at their allowed revision, by source id (see the port)."""
        with self._inspecting(corpus, "listing sources") as (conn, schema, dims):
            return list_sources(conn, schema, dims, (corpus, namespace), allowed, after, limit)

    def source_totals(
        self, corpus: str, namespace: str, allowed: Mapping[str, str]
    ) -> SourceTotals:
        """Counts over what `list_sources` would list (see the port)."""
        with self._inspecting(corpus, "counting sources") as (conn, schema, dims):
            return source_totals(conn, schema, dims, (corpus, namespace), allowed)

    def list_passages(
        self,
        corpus: str,
        namespace: str,
        source_id: str,
        revision: str,
        *,
        after: int | None,
        limit: int,
    ) -> list[PassageSummary]:
        """The passages of exactly that revision, by ordinal (see the port)."""
        with self._inspecting(corpus, "listing passages") as (conn, schema, _):
            key = (corpus, namespace, source_id, revision)
            return list_passages(conn, schema, key, after, limit)

    def read_passage(
        self,
        corpus: str,
        namespace: str,
        chunk_id: str,
        readable: Callable[[str, str], bool],
    ) -> StoredPassage | None:
        """The stored passage with that chunk id if `readable`, or None (see the port)."""
        with self._inspecting(corpus, "reading a passage") as (conn, schema, _):
            return read_passage(conn, schema, (corpus, namespace, chunk_id), readable)

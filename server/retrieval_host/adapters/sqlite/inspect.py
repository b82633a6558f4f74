"""Inspection reads of the SQLite store (`VectorStore.list_sources` and the rest).

Each is one statement on the store's connection (one snapshot), but `read_passage`: two in one
transaction, its grant asked between them. A grant is passed as a JSON object and joined with
`json_each`, so the unique (corpus, namespace, source id) index finds each granted source; text
compares by BINARY collation, i.e. by code point.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping

import apsw

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
from retrieval_host.adapters.sqlite.schema import transaction
from retrieval_host.core.inspection import (
    PassageSummary,
    SourceSummary,
    SourceTotals,
    StoredPassage,
)
from retrieval_host.core.models import Location

# CROSS JOIN: SQLite then keeps the tables in this order, the grant outside and each granted
# source found by the unique index. With a plain JOIN (and no ANALYZE statistics) it chose the
# namespace's sources outside and scanned the whole grant for each: 10,000 sources granted
# in a namespace of 10,000 cost 11 s of CPU per `GET /v1/corpora`, under the store's lock
# every search needs (probe Q, session 41); 12 ms this way.
_GRANTED = (
    "FROM json_each(?) AS g CROSS JOIN sources AS s ON s.corpus_id = ? AND s.namespace = ? "
    "AND s.source_id = g.key AND s.revision = g.value"
)
_PASSAGE = (
    "FROM chunks AS c JOIN sources AS s ON s.id = c.source_pk "
    "WHERE c.corpus_id = ? AND c.namespace = ? AND c.chunk_id = ?"
)


def list_sources(
    conn: apsw.Connection,
    dimensions: int,
    key: tuple[str, str],
    allowed: Mapping[str, str],
    after: str | None,
    limit: int,
) -> list[SourceSummary]:
    # The version of the write is the corpus generation it committed at (`stored_source`).
    rows = conn.execute(
        f"SELECT {LISTED_SOURCE_COLUMNS}, s.generation {_GRANTED} "
        "WHERE s.source_id > ? ORDER BY s.source_id LIMIT ?",
        (json.dumps(dict(allowed)), *key, after or FIRST_SOURCE_ID, limit),
    ).fetchall()
    return [listed_source(row, dimensions) for row in rows]


def source_totals(
    conn: apsw.Connection, dimensions: int, key: tuple[str, str], allowed: Mapping[str, str]
) -> SourceTotals:
    row = conn.execute(
        f"SELECT {TOTAL_COLUMNS} {_GRANTED}",
        (json.dumps(dict(allowed)), *key),
    ).fetchone()
    return SourceTotals() if row is None else totals(row, dimensions)


def list_passages(
    conn: apsw.Connection,
    key: tuple[str, str, str, str],
    after: int | None,
    limit: int,
) -> list[PassageSummary]:
    rows = conn.execute(
        f"SELECT {PASSAGE_COLUMNS}, length(CAST(c.text AS BLOB)) "  # noqa: S608 - constant SQL
        "FROM sources AS s JOIN chunks AS c ON c.source_pk = s.id "
        "WHERE s.corpus_id = ? AND s.namespace = ? AND s.source_id = ? AND s.revision = ? "
        "AND c.ordinal > ? ORDER BY c.ordinal LIMIT ?",
        (*key, FIRST_ORDINAL if after is None else after, limit),
    ).fetchall()
    return [listed_passage(row) for row in rows]


def read_passage(
    conn: apsw.Connection, key: tuple[str, str, str], readable: Callable[[str, str], bool]
) -> StoredPassage | None:
    # The text and metadata are read only once the grant allows them: reading and decoding a
    # hidden source's made its chunk ids answer slower than missing ones (a black-box probe).
    # One transaction, so a writer in another process cannot come between the two reads.
    with contextlib.nullcontext() if conn.in_transaction else transaction(conn, "BEGIN DEFERRED"):
        found = conn.execute(f"SELECT s.source_id, s.revision {_PASSAGE}", key).fetchone()
        if found is None or not readable(str(found[0]), str(found[1])):
            return None
        row = conn.execute(
            f"SELECT {READ_PASSAGE_COLUMNS}, s.media_type {_PASSAGE} "
            "AND s.source_id = ? AND s.revision = ?",
            (*key, *found),
        ).fetchone()
    if row is None:
        return None
    chunk_id, source_id, revision, text, page, start, end, document_id, digest, meta = row[:10]
    return StoredPassage(
        str(chunk_id),
        str(source_id),
        str(revision),
        str(text),
        Location(page, start, end, document_id),
        str(digest),
        json.loads(str(meta)),
        None if row[10] is None else str(row[10]),
    )


class SqliteInspection:
    """The inspection methods of `SqliteVectorStore`, over what its `_inspecting` yields: the
    store's connection under its lock (errors translated) and the corpus's dimensions."""

    def _inspecting(
        self, corpus: str, doing: str
    ) -> contextlib.AbstractContextManager[tuple[apsw.Connection, int]]:
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
        with self._inspecting(corpus, "listing sources") as (conn, dims):
            return list_sources(conn, dims, (corpus, namespace), allowed, after, limit)

    def source_totals(
        self, corpus: str, namespace: str, allowed: Mapping[str, str]
    ) -> SourceTotals:
        """Counts over what `list_sources` would list (see the port)."""
        with self._inspecting(corpus, "counting sources") as (conn, dims):
            return source_totals(conn, dims, (corpus, namespace), allowed)

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
        with self._inspecting(corpus, "listing passages") as (conn, _):
            return list_passages(conn, (corpus, namespace, source_id, revision), after, limit)

    def read_passage(
        self,
        corpus: str,
        namespace: str,
        chunk_id: str,
        readable: Callable[[str, str], bool],
    ) -> StoredPassage | None:
        """The stored passage with that chunk id if `readable`, or None (see the port)."""
        with self._inspecting(corpus, "reading a passage") as (conn, _):
            return read_passage(conn, (corpus, namespace, chunk_id), readable)

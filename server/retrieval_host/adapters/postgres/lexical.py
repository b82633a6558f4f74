"""The PostgreSQL store's lexical index: BM25 from stored term statistics, ranked in SQL.

The same BM25 as the SQLite store (`core.lexical`), so the two stores rank identically rather
than approximately (PostgreSQL's own `ts_rank` is not BM25 and has no per-namespace
statistics). Tables (schema version 2, see `schema`): `chunk_terms` holds each passage's terms
and counts, `chunks.term_count` its length, and `lexical_spaces` one row per corpus namespace
with its passage count and total length.

Writes. `replace_source` and `delete_source` change all three in their own transaction, so a
reader sees one whole revision, lexical and dense alike. Document frequencies are not kept as
counters (every writer of a namespace would then lock the rows of its common terms): a search
counts them from the `chunk_terms` primary key, an index-only count over the postings of its
query terms in that namespace.

Search, in one REPEATABLE READ snapshot: the granted sources are selected exactly as for the
vector search (`search.granted_sources`), the namespace's N and average length read from its
`lexical_spaces` row, df counted per query term, idf computed in Python, and the passages of
the granted sources scored and ranked in SQL (equal scores in chunk id order, byte order).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from psycopg import sql

from retrieval_host.adapters.postgres.pool import Connection
from retrieval_host.adapters.postgres.schema import TERM_COPY_TYPES, schema_sql
from retrieval_host.adapters.postgres.search import (
    granted_sources,
    held_passages,
    pk_array,
    searchable_grant,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.lexical import Bm25, term_frequencies
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate


def space(conn: Connection, schema: str, corpus: str, namespace: str) -> int:
    """The id of a corpus namespace's `lexical_spaces` row, created when missing."""
    conn.execute(
        schema_sql(
            schema,
            "INSERT INTO {s}.lexical_spaces (corpus_id, namespace) VALUES (%s, %s) "
            "ON CONFLICT (corpus_id, namespace) DO NOTHING",
        ),
        (corpus, namespace),
    )
    row = conn.execute(
        schema_sql(
            schema, "SELECT id FROM {s}.lexical_spaces WHERE corpus_id = %s AND namespace = %s"
        ),
        (corpus, namespace),
    ).fetchone()
    assert row is not None  # inserted just above or by a committed writer
    return int(row[0])


def indexed_totals(conn: Connection, schema: str, source_pk: int) -> tuple[int, int]:
    """(passages, total terms) of a stored revision that the lexical index counts."""
    row = conn.execute(
        schema_sql(
            schema,
            "SELECT count(term_count), COALESCE(sum(term_count), 0) FROM {s}.chunks "
            "WHERE source_pk = %s",
        ),
        (source_pk,),
    ).fetchone()
    assert row is not None  # an aggregate returns one row
    return int(row[0]), int(row[1])


def write_terms(
    conn: Connection,
    schema: str,
    space_pk: int,
    source_pk: int,
    terms_by_ordinal: Mapping[int, Mapping[str, int]],
) -> None:
    """Store the term counts of a revision's just-written passages."""
    ids = {
        int(ordinal): int(pk)
        for pk, ordinal in conn.execute(
            schema_sql(schema, "SELECT id, ordinal FROM {s}.chunks WHERE source_pk = %s"),
            (source_pk,),
        )
    }
    copy_terms(conn, schema, space_pk, [(ids[o], t) for o, t in terms_by_ordinal.items()])


def copy_terms(
    conn: Connection,
    schema: str,
    space_pk: int,
    passages: Sequence[tuple[int, Mapping[str, int]]],
) -> None:
    with (
        conn.cursor() as cur,
        cur.copy(
            schema_sql(
                schema,
                "COPY {s}.chunk_terms (space_pk, term, chunk_pk, tf) FROM STDIN "
                "WITH (FORMAT BINARY)",
            )
        ) as copy,
    ):
        copy.set_types(TERM_COPY_TYPES)
        for chunk_pk, terms in passages:
            for term, tf in terms.items():
                copy.write_row((space_pk, term, chunk_pk, tf))


def add_to_space(conn: Connection, schema: str, space_pk: int, passages: int, terms: int) -> None:
    conn.execute(
        schema_sql(
            schema,
            "UPDATE {s}.lexical_spaces SET passages = passages + %s, "
            "total_terms = total_terms + %s WHERE id = %s",
        ),
        (passages, terms, space_pk),
    )


def backfill(conn: Connection, schema: str, stored_version: int) -> None:
    """Build the lexical index of a version-1 schema from the stored passage text (inside
    the migration's transaction; no vector is read or changed)."""
    if stored_version >= 2:
        return
    spaces: dict[tuple[str, str], int] = {}
    rows = conn.execute(
        schema_sql(
            schema,
            "SELECT id, corpus_id, namespace, text FROM {s}.chunks WHERE term_count IS NULL "
            "ORDER BY id",
        )
    ).fetchall()
    batch: dict[int, list[tuple[int, Mapping[str, int]]]] = {}
    lengths: list[tuple[int, int]] = []
    for pk, corpus, namespace, text in rows:
        key = (str(corpus), str(namespace))
        if key not in spaces:
            spaces[key] = space(conn, schema, *key)
        terms = term_frequencies(str(text))
        batch.setdefault(spaces[key], []).append((int(pk), terms))
        lengths.append((sum(terms.values()), int(pk)))
    for space_pk, passages in batch.items():
        copy_terms(conn, schema, space_pk, passages)
    with conn.cursor() as cur:
        cur.executemany(
            schema_sql(schema, "UPDATE {s}.chunks SET term_count = %s WHERE id = %s"), lengths
        )
    conn.execute(
        schema_sql(
            schema,
            "UPDATE {s}.lexical_spaces l SET passages = t.passages, total_terms = t.terms "
            "FROM (SELECT corpus_id, namespace, count(term_count) AS passages, "
            "COALESCE(sum(term_count), 0) AS terms FROM {s}.chunks "
            "GROUP BY corpus_id, namespace) t "
            "WHERE l.corpus_id = t.corpus_id AND l.namespace = t.namespace",
        )
    )


def _weights(
    conn: Connection, schema: str, corpus: str, namespace: str, terms: Sequence[str]
) -> tuple[int, float, list[tuple[str, float]]] | None:
    """The namespace's lexical space id, average passage length, and each query term with
    its weight (occurrences x idf); None when nothing can match."""
    counts = Counter(t for t in terms if "\x00" not in t)
    if not counts:
        return None
    stats = conn.execute(
        schema_sql(
            schema,
            "SELECT id, passages, total_terms FROM {s}.lexical_spaces "
            "WHERE corpus_id = %s AND namespace = %s",
        ),
        (corpus, namespace),
    ).fetchone()
    if stats is None or int(stats[1]) == 0:
        return None
    space_pk, passages, average = int(stats[0]), int(stats[1]), int(stats[2]) / int(stats[1])
    query = list(counts)
    df = {
        str(term): int(n)
        for term, n in conn.execute(
            schema_sql(
                schema,
                "SELECT term, count(*) FROM {s}.chunk_terms "
                "WHERE space_pk = %s AND term = ANY(%s::text[]) GROUP BY term",
            ),
            (space_pk, query),
            prepare=False,
        )
    }
    weighted = [(t, counts[t] * Bm25.idf(df[t], passages)) for t in query if df.get(t)]
    return (space_pk, average, weighted) if weighted else None


# The BM25 sum of one passage over the query terms it holds. The same operations, in the same
# order (terms summed in code point order, `term` being COLLATE "C"), as `sqlite.lexicon.score`:
# both stores give bit-equal scores. Parameters: k1, 1 - b, b, average length, terms, weights,
# space id.
_BM25_SUM: Final = (
    "SELECT t.chunk_pk, sum(w.weight * (t.tf / (t.tf + %s * (%s + %s * c.term_count "
    "/ %s))) ORDER BY t.term) AS score "
    "FROM unnest(%s::text[], %s::float8[]) AS w (term, weight) "
    "JOIN {s}.chunk_terms t ON t.space_pk = %s AND t.term = w.term "
    "JOIN {s}.chunks c ON c.id = t.chunk_pk"
)


def _bm25_sql(schema: str, template: str) -> sql.Composed:
    """`template` with `{bm25}` standing for `_BM25_SUM` and `{s}` for the schema."""
    schema_name = sql.Identifier(schema)
    return sql.SQL(template).format(bm25=sql.SQL(_BM25_SUM).format(s=schema_name), s=schema_name)


def _bm25_params(
    descriptor: CorpusDescriptor, space_pk: int, average: float, weighted: list[tuple[str, float]]
) -> tuple[object, ...]:
    lexical = descriptor.lexical
    return (
        float(lexical.k1),
        1.0 - lexical.b,
        float(lexical.b),
        average,
        [t for t, _ in weighted],
        [w for _, w in weighted],
        space_pk,
    )


def lexical_search(
    conn: Connection,
    schema: str,
    descriptor: CorpusDescriptor,
    namespace: str,
    allowed: Mapping[str, str],
    terms: Sequence[str],
    k: int,
    cancel: CancelToken,
    filters: MetadataFilter | None,
) -> list[Candidate]:
    """`PgVectorStore.lexical_search` on a connection already in a read-only snapshot."""
    corpus = descriptor.corpus_id
    pairs = searchable_grant(corpus, namespace, allowed)
    if k <= 0 or not pairs:
        return []
    weights = _weights(conn, schema, corpus, namespace, terms)
    if weights is None:
        return []
    sources = granted_sources(conn, schema, corpus, namespace, pairs, filters)
    if not sources:
        return []
    cancel.check()
    rows: list[tuple[Any, ...]] = conn.execute(
        _bm25_sql(
            schema,
            "SELECT c.chunk_id, c.text, c.page, c.start_line, c.end_line, c.document_id, "
            "s.source_id, s.revision, s.document_sha256, r.score, s.metadata_json FROM ("
            "{bm25} WHERE c.source_pk = ANY(%s::bigint[]) GROUP BY t.chunk_pk) r "
            "JOIN {s}.chunks c ON c.id = r.chunk_pk JOIN {s}.sources s ON s.id = c.source_pk "
            'ORDER BY r.score DESC, c.chunk_id COLLATE "C" LIMIT %s',
        ),
        (
            *_bm25_params(descriptor, *weights),
            pk_array(pk for pk, _ in sources),
            k,
        ),
        prepare=False,
    ).fetchall()
    cancel.progress()
    return [
        Candidate(
            chunk_id=str(row[0]),
            source_id=str(row[6]),
            revision=str(row[7]),
            text=str(row[1]),
            location=Location(row[2], row[3], row[4], row[5]),
            document_sha256=str(row[8]),
            score=float(row[9]),
            metadata=json.loads(row[10]),
        )
        for row in rows
    ]


def lexical_scores(
    conn: Connection,
    schema: str,
    descriptor: CorpusDescriptor,
    namespace: str,
    passages: Sequence[Candidate],
    terms: Sequence[str],
) -> list[float | None]:
    """`PgVectorStore.lexical_scores` on a connection already in a read-only snapshot."""
    held = held_passages(conn, schema, descriptor.corpus_id, namespace, passages)
    weights = _weights(conn, schema, descriptor.corpus_id, namespace, terms)
    found: dict[int, float] = {}
    if held and weights is not None:
        found = {
            int(pk): float(value)
            for pk, value in conn.execute(
                _bm25_sql(
                    schema, "{bm25} WHERE t.chunk_pk = ANY(%s::bigint[]) GROUP BY t.chunk_pk"
                ),
                (*_bm25_params(descriptor, *weights), pk_array(pk for pk, _ in held.values())),
                prepare=False,
            )
        }
    return [
        None if (row := held.get(i)) is None else found.get(row[0], 0.0)
        for i in range(len(passages))
    ]

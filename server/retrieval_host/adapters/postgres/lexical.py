"""The PostgreSQL store's lexical index: BM25 from stored term statistics, ranked in SQL.

The same BM25 as the SQLite store (`core.lexical`), so the two stores rank identically rather
than approximately (PostgreSQL's own `ts_rank` is not BM25 and has no per-grant statistics).
Tables (schema version 2, see `schema`): `chunk_terms` holds each passage's terms and counts,
`chunks.term_count` its length, and `lexical_spaces` one row per corpus namespace (the key of
its postings) with its passage count and total length.

Writes. `replace_source` and `delete_source` change all three in their own transaction, so a
reader sees one whole revision, lexical and dense alike. Document frequencies are not kept as
counters (every writer of a namespace would then lock the rows of its common terms).

Search, in one REPEATABLE READ snapshot: the granted sources are selected exactly as for the
vector search (`search.granted_sources`: the allowed revisions matching the filters); N, the
total length and df per query term are counted over those sources' passages only (never the
namespace's: a score must not move when a source the caller may not read is added or deleted,
`VectorStore.lexical_search`); idf is computed in Python, and the passages of the granted
sources scored and ranked in SQL (equal scores in chunk id order, byte order).

Counting df joins each posting of the query terms to its passage, so it is done on the smaller
side (`_statistics`): over the granted passages, or as the namespace's count minus that of its
other sources' passages. N and the total length are sums of per-revision totals kept in memory
(`SourceTotals`: a revision's passages never change), read once per revision from its passage
rows. No schema change; per-revision totals stored in `sources` would spare that first read.

Terms are stored and looked up by `term_key`: the term itself, or for one over 1,024 bytes a
shorter key (the primary key's btree cannot hold it).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1, Bm25, term_frequencies
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate

# A term of at most this many bytes of UTF-8 is its own key in `chunk_terms`; a longer one is
# keyed by `term_key`. PostgreSQL's btree refuses an index row over 2,704 bytes (a third of a
# page), and `term` is part of the primary key: a passage holding one long word that does not
# compress (a 2,800-digit hex dump, a base64 blob) failed its whole source with a database
# error, retried forever in vain, while SQLite indexed it (probe "parity", session 44). Rows
# written before keys hold a longer term as itself (up to about 2,680 bytes, longer where it
# compressed: measured on PostgreSQL 18); a search looks such a term up under both (`_weights`),
# so no stored row changes and nothing is migrated.
TERM_KEY_BYTES: Final = 1_024
# The characters of a long term its key begins with (at most 800 bytes, the key 865).
_KEY_PREFIX_CHARS: Final = 200


def term_key(term: str) -> str:
    """A term's key in `chunk_terms`: the term, or for one over `TERM_KEY_BYTES` its first 200
    characters, a space and the SHA-256 of the whole term in hex. No analyzer term holds a
    space (`core.lexical`: terms are runs of word characters, marks and compound joints), so a
    key equals no other term, and a long query term matches exactly the passages holding it.
    Keys keep the terms' code point order, but for a long term and another sharing its first
    200 characters (the key's space sorts before any of their next characters)."""
    if len(term) <= TERM_KEY_BYTES // 4:  # at most 4 bytes a character: no need to encode
        return term
    encoded = term.encode()
    if len(encoded) <= TERM_KEY_BYTES:
        return term
    return f"{term[:_KEY_PREFIX_CHARS]} {hashlib.sha256(encoded).hexdigest()}"


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
    """Write passages' term counts, each term under its `term_key` (writes and the backfill)."""
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
                copy.write_row((space_pk, term_key(term), chunk_pk, tf))


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
    if stored_version < 2:
        heal(conn, schema)


def heal(conn: Connection, schema: str) -> int:
    """Analyze every passage without terms (`term_count` NULL) and recount each namespace's
    statistics from the rows; how many passages were analyzed. Only a replica of the release
    before the lexical index writes such passages, and its deletes leave the counts behind:
    one still serving after a newer one migrated the schema (a rolling upgrade, a black-box
    test) left its writes out of lexical search for good. Run at every writable open, under
    the schema's lock; those passages' corpora predate the other analyzers."""
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
        terms = term_frequencies(str(text), ANALYZER_EN_SNOWBALL_1)  # schema 1 predates others
        batch.setdefault(spaces[key], []).append((int(pk), terms))
        lengths.append((sum(terms.values()), int(pk)))
    for space_pk, passages in batch.items():
        copy_terms(conn, schema, space_pk, passages)
    with conn.cursor() as cur:
        cur.executemany(
            schema_sql(schema, "UPDATE {s}.chunks SET term_count = %s WHERE id = %s"), lengths
        )
    # Writers keep the counts in their own transactions (`passages + n`) without the schema's
    # lock: the rows are locked first, so the recount's own statement, with a snapshot taken
    # once every writer holding one has committed, counts their passages. Counted from the
    # snapshot of a single statement, a write committed while it waited was overwritten (a
    # black-box test: the counts fell behind the rows and a later delete broke their check).
    conn.execute(schema_sql(schema, "SELECT id FROM {s}.lexical_spaces ORDER BY id FOR UPDATE"))
    conn.execute(
        schema_sql(
            schema,
            # Every space, an emptied one too (to 0: a join with the groups left it as it was).
            "UPDATE {s}.lexical_spaces l SET (passages, total_terms) = "
            "(SELECT count(c.term_count), COALESCE(sum(c.term_count), 0) FROM {s}.chunks c "
            "WHERE c.corpus_id = l.corpus_id AND c.namespace = l.namespace)",
        )
    )
    return len(lengths)


@dataclass(frozen=True, slots=True)
class _Space:
    """A namespace's `lexical_spaces` row: its postings' key and its passage and term counts
    (kept by every writer in its own transaction, so they agree with the rows of a snapshot)."""

    pk: int
    passages: int
    total_terms: int


def _space(conn: Connection, schema: str, corpus: str, namespace: str) -> _Space | None:
    row = conn.execute(
        schema_sql(
            schema,
            "SELECT id, passages, total_terms FROM {s}.lexical_spaces "
            "WHERE corpus_id = %s AND namespace = %s",
        ),
        (corpus, namespace),
    ).fetchone()
    return None if row is None else _Space(int(row[0]), int(row[1]), int(row[2]))


# Bounds `SourceTotals`: two integers per source revision; past this many, it starts over.
SOURCE_TOTALS: Final = 1_000_000


class SourceTotals:
    """Per stored source revision (its `sources.id`): its analyzed passages and their total
    length, kept in memory by one store instance.

    Exact forever once read: a revision's passages are written with its `sources` row, in one
    transaction, and never changed (a new revision, or a delete, removes the row and its
    passages; `sources.id` is an identity, never reused). So a grant's N and total length cost
    one dictionary read per source after the first search, instead of reading every granted
    passage row (100k of them: about 30 ms here, more with wide vectors)."""

    def __init__(self, limit: int = SOURCE_TOTALS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._totals: dict[int, tuple[int, int]] = {}

    def sum(self, conn: Connection, schema: str, pks: Sequence[int]) -> tuple[int, int]:
        """(passages, total length) over the revisions `pks`, all visible in the snapshot of
        `conn` (those not yet known are read from it, in one statement)."""
        with self._lock:
            known = [self._totals.get(pk) for pk in pks]
        missing = [pk for pk, totals in zip(pks, known, strict=True) if totals is None]
        read: dict[int, tuple[int, int]] = {}
        if missing:
            read = {pk: (0, 0) for pk in missing}  # a revision without analyzed passages
            for pk, passages, total in conn.execute(
                schema_sql(
                    schema,
                    "SELECT source_pk, count(term_count), COALESCE(sum(term_count), 0) "
                    "FROM {s}.chunks WHERE source_pk = ANY(%s::bigint[]) GROUP BY source_pk",
                ),
                (pk_array(missing),),
                prepare=False,
            ):
                read[int(pk)] = (int(passages), int(total))
            with self._lock:
                if len(self._totals) + len(read) > self._limit:
                    self._totals.clear()
                self._totals.update(read)
        passages = total = 0
        for pk, totals in zip(pks, known, strict=True):
            n, length = totals if totals is not None else read[pk]
            passages += n
            total += length
        return passages, total


# df per query term over the passages of some sources (the granted ones, or the others).
_SOURCES_DF: Final = (
    "SELECT t.term, count(*) FROM {s}.chunk_terms t JOIN {s}.chunks c ON c.id = t.chunk_pk "
    "WHERE t.space_pk = %s AND t.term = ANY(%s::text[]) AND c.source_pk = ANY(%s::bigint[]) "
    "GROUP BY t.term"
)
# The namespace's *other* sources (not granted, or filtered out): subtracted from the
# namespace's counts when the grant holds most of the namespace.
_REST_SOURCES: Final = (
    "SELECT id FROM {s}.sources "
    "WHERE corpus_id = %s AND namespace = %s AND NOT (id = ANY(%s::bigint[]))"
)
_SPACE_DF: Final = (
    "SELECT term, count(*) FROM {s}.chunk_terms WHERE space_pk = %s AND term = ANY(%s::text[]) "
    "GROUP BY term"
)


def _statistics(
    conn: Connection,
    schema: str,
    totals: SourceTotals,
    corpus: str,
    namespace: str,
    space: _Space,
    sources: Sequence[tuple[int, int]],
    query: list[str],
) -> tuple[int, int, dict[str, int]]:
    """(N, total length, df per query term) over the passages of `sources` exactly.

    df is counted on the smaller side: over the granted passages' postings, or, when they are
    most of the namespace, as the namespace's count minus that of its other passages (a full
    grant then joins no posting to its passage). N and the total length come from `totals`,
    on the same side."""
    pks = [pk for pk, _ in sources]
    granted = pk_array(pks)

    def run(template: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        return conn.execute(schema_sql(schema, template), params, prepare=False).fetchall()

    if 2 * sum(count for _, count in sources) <= space.passages:
        passages, total = totals.sum(conn, schema, pks)
        df = {str(t): int(n) for t, n in run(_SOURCES_DF, (space.pk, query, granted))}
        return passages, total, df
    others = [int(pk) for (pk,) in run(_REST_SOURCES, (corpus, namespace, granted))]
    df = {str(t): int(n) for t, n in run(_SPACE_DF, (space.pk, query))}
    if not others:
        return space.passages, space.total_terms, df
    rest_passages, rest_total = totals.sum(conn, schema, others)
    for term, n in run(_SOURCES_DF, (space.pk, query, pk_array(others))):
        df[str(term)] -= int(n)
    return space.passages - rest_passages, space.total_terms - rest_total, df


def _weights(
    conn: Connection,
    schema: str,
    totals: SourceTotals,
    corpus: str,
    namespace: str,
    space: _Space,
    sources: Sequence[tuple[int, int]],
    terms: Sequence[str],
) -> tuple[int, float, list[tuple[str, float]]] | None:
    """The lexical space id, the average passage length, and each query term with its
    weight (occurrences x idf), N, the lengths and df counted over the passages of `sources`
    only (the granted revisions: what the search may rank); None when nothing can match."""
    # Keyed as stored (`term_key`): df, weights and the BM25 sum all see keys. A long term is
    # also looked up as itself, as rows written before keys hold it (`TERM_KEY_BYTES`); one
    # passage holds one of the two, so its df is the sum of both and both carry its weight.
    counts = Counter(term_key(t) for t in terms if "\x00" not in t)
    if not counts or not sources:
        return None
    as_written = {key: t for t in terms if (key := term_key(t)) != t and "\x00" not in t}
    query = [*counts, *as_written.values()]
    passages, total, df = _statistics(
        conn, schema, totals, corpus, namespace, space, sources, query
    )
    if passages <= 0:
        return None
    for key, term in as_written.items():
        df[key] = df.get(key, 0) + df.pop(term, 0)
    # Python's int / int, as the SQLite store divides: the same (correctly rounded) float.
    average = total / passages
    weighted = [(t, counts[t] * Bm25.idf(df[t], passages)) for t in counts if df.get(t)]
    weighted += [(as_written[t], weight) for t, weight in weighted if t in as_written]
    return (space.pk, average, weighted) if weighted else None


# The BM25 sum of one passage over the query terms it holds. The same operations, in the same
# order (terms summed in code point order, `term` being COLLATE "C"), as `sqlite.lexicon.score`:
# both stores give bit-equal scores. `term` holds keys (`term_key`): only a query holding a term
# over 1,024 bytes, beside another term sharing its first 200 characters, may sum in another
# order than SQLite's (its scores then may differ in the last bits). Parameters: k1, 1 - b, b,
# average length, terms, weights, space id.
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
    totals: SourceTotals,
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
    space = _space(conn, schema, corpus, namespace)
    if space is None:
        return []
    sources = granted_sources(conn, schema, corpus, namespace, pairs, filters)
    weights = _weights(conn, schema, totals, corpus, namespace, space, sources, terms)
    if weights is None:
        return []
    cancel.check()
    rows: list[tuple[Any, ...]] = conn.execute(
        _bm25_sql(
            schema,
            "SELECT c.chunk_id, c.text, c.page, c.start_line, c.end_line, c.document_id, "
            "s.source_id, s.revision, s.document_sha256, r.score, s.metadata_json, "
            "s.media_type FROM ("
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
            media_type=None if row[11] is None else str(row[11]),
        )
        for row in rows
    ]


def lexical_scores(
    conn: Connection,
    schema: str,
    totals: SourceTotals,
    descriptor: CorpusDescriptor,
    namespace: str,
    allowed: Mapping[str, str],
    passages: Sequence[Candidate],
    terms: Sequence[str],
    filters: MetadataFilter | None,
) -> list[float | None]:
    """`PgVectorStore.lexical_scores` on a connection already in a read-only snapshot: the
    statistics `lexical_search` takes for the same grant and filters."""
    corpus = descriptor.corpus_id
    nothing: list[float | None] = [None] * len(passages)
    held = held_passages(conn, schema, corpus, namespace, passages)
    pairs = searchable_grant(corpus, namespace, allowed)
    space = _space(conn, schema, corpus, namespace) if held and pairs else None
    if space is None:
        return nothing
    sources = granted_sources(conn, schema, corpus, namespace, pairs, filters)
    if not sources:
        return nothing
    # The held passages that search could rank (of an allowed revision matching the filters).
    granted = {pk for pk, _ in sources}
    rankable = {int(chunk) for chunk, source in held.values() if int(source) in granted}
    weights = (
        _weights(conn, schema, totals, corpus, namespace, space, sources, terms)
        if rankable
        else None
    )
    found: dict[int, float] = {}
    if weights is not None:
        found = {
            int(pk): float(value)
            for pk, value in conn.execute(
                _bm25_sql(
                    schema, "{bm25} WHERE t.chunk_pk = ANY(%s::bigint[]) GROUP BY t.chunk_pk"
                ),
                (
                    *_bm25_params(descriptor, *weights),
                    pk_array(pk for pk in rankable),
                ),
                prepare=False,
            )
        }
    return [
        None if (row := held.get(i)) is None or row[0] not in rankable else found.get(row[0], 0.0)
        for i in range(len(passages))
    ]

"""How the PostgreSQL store searches: the grant matched in SQL, then an exact or an HNSW scan.

One REPEATABLE READ, READ ONLY transaction (one snapshot for every step): the allowed
`(source, revision)` pairs are matched in SQL against `sources` inside the corpus and namespace,
with the metadata filters (`filters.filter_sql` over `jsonb`), before anything is ranked. Then:

- exact (the default): the allowed rows are scored in SQL by cosine distance in batches of
  `scan_batch_rows` rows (each batch returns only its best `k`), checking the cancel token
  before each batch, as the SQLite store does;
- HNSW (`hnsw=True`): when at least `hnsw_min_rows` rows are allowed, one index scan on a
  partial expression index `((embedding::vector(D)) vector_cosine_ops) WHERE dimensions = D`
  with `hnsw.ef_search` and, on pgvector >= 0.8, `hnsw.iterative_scan = relaxed_order`, so the
  filter does not starve the result. If the index still returns fewer than `min(k, allowed
  rows)` (pgvector stops at `hnsw.max_scan_tuples`), the exact scan answers instead. Smaller
  grants use the exact scan directly: it is exact and as fast there.

Final scores are computed in NumPy from the returned vectors exactly as the SQLite store does
(float32 unit vectors), which also restores strict order after a relaxed-order index scan.

Cancellation. The token is checked before each batch (or before the index scan); a statement in
flight is bounded by `statement_timeout_ms` (session setting), not interrupted by the token.

Search statements run with `prepare=False`: psycopg prepares a statement after a few
executions, and PostgreSQL may then switch to a generic plan that cannot see the grant (the
arrays of sources) and picks a poor path. Planning them costs well under a millisecond.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg import sql

from retrieval_host.adapters._store_rules import CounterTally, cosines, stack_vectors, unit_rows
from retrieval_host.adapters.postgres.filters import filter_sql
from retrieval_host.adapters.postgres.pool import (
    Connection,
    ConnectionPool,
    transaction,
    translated,
)
from retrieval_host.adapters.postgres.schema import HNSW_MAX_DIMENSIONS, schema_sql
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.models import Location
from retrieval_host.core.ports import ApproximateRanking, Candidate, Vectors

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class PgSearchStats:
    """Which path searches took (a snapshot): index scans, and exact fallbacks after them."""

    index_scans: int = 0
    exact_fallbacks: int = 0


@dataclass(frozen=True, slots=True)
class Scored:
    pk: int
    source_pk: int
    ordinal: int
    vector: Matrix


class Searcher:
    """The search path of one `PgVectorStore`: its settings, and which path searches took."""

    def __init__(
        self,
        schema: str,
        counters: CounterTally,
        *,
        hnsw: bool,
        iterative_scan: bool,
        ef_search: int,
        hnsw_min_rows: int,
        scan_batch_rows: int,
    ) -> None:
        self._schema = schema
        self.counters = self._counters = counters
        self.hnsw = hnsw
        self._iterative = iterative_scan
        self._ef_search = ef_search
        self.hnsw_min_rows = hnsw_min_rows
        self._batch = scan_batch_rows
        self._lock = threading.Lock()
        self._stats = PgSearchStats()

    @property
    def stats(self) -> PgSearchStats:
        """A snapshot of how many searches used the HNSW index, and fell back from it."""
        with self._lock:
            return self._stats

    def search(
        self,
        pool: ConnectionPool,
        descriptor: CorpusDescriptor,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        """`PgVectorStore.search` for an open corpus's descriptor, on a pooled connection."""
        corpus = descriptor.corpus_id
        dims = descriptor.embedding.dimensions
        raw_query = stack_vectors(dims, [query], "the query vector")
        unit_query = unit_rows(raw_query, "the query vector")[0]
        if k <= 0 or not allowed:
            return []
        pairs = searchable_grant(corpus, namespace, allowed)
        if not pairs:
            return []

        with (
            pool.connection() as conn,
            translated("searching"),
            transaction(conn, repeatable_read=True, read_only=True),
        ):
            sources = granted_sources(conn, self._schema, corpus, namespace, pairs, filters)
            total = sum(count for _, count in sources)
            if total == 0:
                return []
            self._counters.add(scans_started=1)
            scored: list[Scored] | None = None
            if self.hnsw and dims <= HNSW_MAX_DIMENSIONS and total >= self.hnsw_min_rows:
                scored = self._index_scan(conn, dims, sources, raw_query[0], k, cancel)
                if len(scored) < min(k, total):
                    scored = None  # the index gave up early (max_scan_tuples): exact
                    self._stat(exact_fallbacks=1)
                else:
                    self._counters.add(approximate_searches=1)
                    return ApproximateRanking(self._finish(conn, scored, unit_query, sources, k))
            scored = self._exact_scan(conn, sources, raw_query[0], k, cancel)
            return self._finish(conn, scored, unit_query, sources, k)

    def dense_scores(
        self,
        pool: ConnectionPool,
        descriptor: CorpusDescriptor,
        namespace: str,
        passages: Sequence[Candidate],
        query: Vectors,
        cancel: CancelToken,
    ) -> list[float | None]:
        """`PgVectorStore.dense_scores`: the passages' stored vectors read in one statement
        and scored as `_finish` scores a search's."""
        dims = descriptor.embedding.dimensions
        unit_query = unit_rows(stack_vectors(dims, [query], "the query vector"), "the query vector")
        if not passages:
            return []
        cancel.check()
        with (
            pool.connection() as conn,
            translated("searching"),
            transaction(conn, repeatable_read=True, read_only=True),
        ):
            held = held_passages(
                conn, self._schema, descriptor.corpus_id, namespace, passages, vectors=True
            )
        if not held:
            return [None] * len(passages)
        at = sorted(held)
        vectors = [_scored((0, 0, 0, held[i][1])).vector for i in at]
        scores = cosines(unit_rows(np.stack(vectors), "stored vectors"), unit_query[0])
        by_position = dict(zip(at, scores, strict=True))
        return [by_position.get(i) for i in range(len(passages))]

    def _index_scan(
        self,
        conn: Connection,
        dims: int,
        sources: list[tuple[int, int]],
        query: Matrix,
        k: int,
        cancel: CancelToken,
    ) -> list[Scored]:
        self._check(cancel)
        # `enable_sort` off for this transaction: the store has decided on the index (by the
        # grant's row count), and the planner must not trade it for a filtered scan plus a
        # sort. Left to itself its choice flipped with the table statistics of the moment
        # (autovacuum's ANALYZE), so the same search used the index or not by timing.
        conn.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), "
            "set_config('hnsw.iterative_scan', %s, true), "
            "set_config('enable_sort', 'off', true)",
            (str(self._ef_search), "relaxed_order" if self._iterative else "off"),
        )
        # The dimension is a literal so the planner can match the partial expression index.
        rows = conn.execute(
            sql.SQL(
                "SELECT c.id, c.source_pk, c.ordinal, c.embedding FROM {s}.chunks c "
                "WHERE c.dimensions = {d} AND c.source_pk = ANY(%s) "
                "ORDER BY c.embedding::vector({d}) <=> %s::vector({d}) LIMIT %s"
            ).format(s=sql.Identifier(self._schema), d=sql.Literal(dims)),
            # A typed list, not `pk_array`: the planner must see the array's length to
            # choose the HNSW index (a text cast to bigint[] hides it).
            ([pk for pk, _ in sources], query, k),
            binary=True,  # vectors in binary: parsing their text form costs milliseconds
            prepare=False,
        ).fetchall()
        self._counters.add(scan_batches=1, rows_scored=len(rows))
        self._stat(index_scans=1)
        cancel.progress()
        return [_scored(row) for row in rows]

    def _exact_scan(
        self,
        conn: Connection,
        sources: list[tuple[int, int]],
        query: Matrix,
        k: int,
        cancel: CancelToken,
    ) -> list[Scored]:
        statement = self._sql(
            "SELECT b.id, b.source_pk, b.ordinal, b.embedding FROM ("
            "SELECT c.id, c.source_pk, c.ordinal, c.embedding FROM {s}.chunks c "
            "WHERE c.source_pk = ANY(%s::bigint[]) "
            "ORDER BY c.source_pk, c.ordinal OFFSET %s LIMIT %s"
            ") b ORDER BY b.embedding <=> %s, b.source_pk, b.ordinal LIMIT %s"
        )
        kept: list[Scored] = []
        for pks, skip, size in _batches(sources, self._batch):
            self._check(cancel)
            rows = conn.execute(
                statement, (pk_array(pks), skip, size, query, k), binary=True, prepare=False
            ).fetchall()
            kept.extend(_scored(row) for row in rows)
            self._counters.add(scan_batches=1, rows_scored=size)
            cancel.progress()
        return kept

    def _finish(
        self,
        conn: Connection,
        scored: list[Scored],
        unit_query: Matrix,
        sources: list[tuple[int, int]],
        k: int,
    ) -> list[Candidate]:
        if not scored:
            return []
        matrix = unit_rows(np.stack([s.vector for s in scored]), "stored vectors")
        scores = cosines(matrix, unit_query)  # as `dense_scores` scores, to the last bit
        # Best first; equal scores in (source revision, ordinal) order, as SQLite breaks ties.
        position = {pk: i for i, (pk, _) in enumerate(sources)}
        order = sorted(
            range(len(scored)),
            key=lambda i: (-scores[i], position[scored[i].source_pk], scored[i].ordinal),
        )[:k]
        chosen = [scored[i].pk for i in order]
        details = {
            int(row[0]): row
            for row in conn.execute(
                self._sql(
                    "SELECT c.id, c.chunk_id, c.text, c.page, c.start_line, c.end_line, "
                    "c.document_id, s.source_id, s.revision, s.document_sha256, s.metadata_json, "
                    "s.media_type FROM {s}.chunks c JOIN {s}.sources s ON s.id = c.source_pk "
                    "WHERE c.id = ANY(%s)"
                ),
                (chosen,),
                prepare=False,
            )
        }
        results: list[Candidate] = []
        for i in order:
            row = details[scored[i].pk]
            results.append(
                Candidate(
                    chunk_id=str(row[1]),
                    source_id=str(row[7]),
                    revision=str(row[8]),
                    text=str(row[2]),
                    location=Location(row[3], row[4], row[5], row[6]),
                    document_sha256=str(row[9]),
                    score=scores[i],
                    metadata=json.loads(row[10]),
                    media_type=None if row[11] is None else str(row[11]),
                )
            )
        return results

    def _sql(self, template: str) -> sql.Composed:
        return schema_sql(self._schema, template)

    def _check(self, cancel: CancelToken) -> None:
        try:
            cancel.check()
        except RetrievalError:
            self._counters.add(scans_cancelled=1)
            raise

    def _stat(self, *, index_scans: int = 0, exact_fallbacks: int = 0) -> None:
        with self._lock:
            s = self._stats
            self._stats = PgSearchStats(
                s.index_scans + index_scans, s.exact_fallbacks + exact_fallbacks
            )


def searchable_grant(
    corpus: str, namespace: str, allowed: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The allowed (source, revision) pairs that could be stored; empty when nothing can.
    (Filters need no such check: `core.filters` refuses NUL in their keys and values.)"""
    if "\x00" in namespace + corpus:
        return []  # nothing stored can contain NUL
    return [(s, r) for s, r in allowed.items() if "\x00" not in s + r]


def granted_sources(
    conn: Connection,
    schema: str,
    corpus: str,
    namespace: str,
    pairs: list[tuple[str, str]],
    filters: MetadataFilter | None,
) -> list[tuple[int, int]]:
    """(source pk, passage count) of the granted revisions in the namespace that match the
    filters, in pk order: what a search may rank, selected before anything is ranked."""
    # The grant travels as one JSON object (source id -> revision): psycopg dumps a text in C,
    # where three text arrays of a large grant cost tens of milliseconds of Python per search.
    # The join drives index lookups on (corpus, namespace, source id) from the grant's rows:
    # the cost follows the grant, not the size of the namespace.
    params: list[object] = [json.dumps(dict(pairs)), corpus, namespace]
    condition = filter_sql(filters, params)
    return [
        (int(pk), int(count))
        for pk, count in conn.execute(
            sql.SQL(
                "SELECT s.id, s.chunk_count FROM jsonb_each_text(%s::jsonb) AS a "
                "JOIN {s}.sources s ON s.source_id = a.key AND s.revision = a.value "
                "WHERE s.corpus_id = %s AND s.namespace = %s AND {where} "
                "ORDER BY s.id",
            ).format(s=sql.Identifier(schema), where=condition),
            params,
            prepare=False,
        )
        if int(count) > 0
    ]


def held_passages(
    conn: Connection,
    schema: str,
    corpus: str,
    namespace: str,
    passages: Sequence[Candidate],
    *,
    vectors: bool = False,
) -> dict[int, tuple[int, Any]]:
    """Position in `passages` -> (chunk pk, its stored vector when `vectors`, else its source
    revision's pk), for the passages stored in the namespace at their candidate's revision."""
    if "\x00" in namespace + corpus:
        return {}
    wanted = [
        {"at": i, "chunk": p.chunk_id, "source": p.source_id, "revision": p.revision}
        for i, p in enumerate(passages)
        if "\x00" not in p.chunk_id + p.source_id + p.revision
    ]
    if not wanted:
        return {}
    rows = conn.execute(
        sql.SQL(
            "SELECT a.at, c.id, {v} FROM jsonb_to_recordset(%s::jsonb) "
            "AS a (at integer, chunk text, source text, revision text) "
            "JOIN {s}.chunks c ON c.corpus_id = %s AND c.namespace = %s AND c.chunk_id = a.chunk "
            "JOIN {s}.sources s ON s.id = c.source_pk AND s.source_id = a.source "
            "AND s.revision = a.revision"
        ).format(s=sql.Identifier(schema), v=sql.SQL("c.embedding" if vectors else "c.source_pk")),
        (json.dumps(wanted), corpus, namespace),
        binary=vectors,
        prepare=False,
    ).fetchall()
    return {int(row[0]): (int(row[1]), row[2]) for row in rows}


def pk_array(pks: Iterable[int]) -> str:
    """Row ids as a PostgreSQL array literal, for `= ANY(%s::bigint[])`: one text parameter,
    dumped in C, instead of a list psycopg dumps element by element."""
    return "{" + ",".join(str(int(pk)) for pk in pks) + "}"


def _scored(row: tuple[Any, ...]) -> Scored:
    value = row[3]
    vector = value.to_numpy() if hasattr(value, "to_numpy") else value  # a pgvector `Vector`
    return Scored(int(row[0]), int(row[1]), int(row[2]), np.asarray(vector, dtype=np.float32))


def _batches(sources: list[tuple[int, int]], size: int) -> Iterator[tuple[list[int], int, int]]:
    """Split the rows of `sources` (in source, ordinal order) into runs of `size` rows.

    Each run is (source pks it touches, rows of the first source to skip, row count): the rows
    a query ordered by (source_pk, ordinal) returns after OFFSET skip LIMIT count.
    """
    total = sum(count for _, count in sources)
    at = 0  # index of the first source still holding unscanned rows
    used = 0  # rows of that source already scanned
    for start in range(0, total, size):
        count = min(size, total - start)
        skip = used
        pks: list[int] = []
        need = count
        while need > 0:
            pk, n = sources[at]
            pks.append(pk)
            take = min(n - used, need)
            need -= take
            used += take
            if used == n:
                at += 1
                used = 0
        yield pks, skip, count

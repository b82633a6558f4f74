"""The search methods of `SqliteVectorStore` (dense, lexical, and the scores of named
passages), over its in-memory corpus state. Writes, loading and cache maintenance stay in
`vector_store.py`; this mixin declares what it uses of them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from retrieval_host.adapters._store_rules import CounterTally, cosines
from retrieval_host.adapters.sqlite import approximate
from retrieval_host.adapters.sqlite.grant_cache import GrantCache
from retrieval_host.adapters.sqlite.lexicon import score, score_slots
from retrieval_host.adapters.sqlite.rows import Row
from retrieval_host.adapters.sqlite.scan import Index, Matrix, Scan, Scanner, query_unit
from retrieval_host.adapters.sqlite.segment import CorpusState, Segment, Verdicts, decide
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.lexical import Bm25
from retrieval_host.core.ports import ApproximateRanking, Candidate, Vectors
from retrieval_host.core.waits import locked


class SqliteSearch:
    """Search over the cached corpus state; `SqliteVectorStore` provides the state."""

    _cache_lock: threading.Lock
    _scanner: Scanner
    _grants: GrantCache
    _graphs: approximate.Builder
    _approximate_min_rows: int
    _counters: CounterTally

    def _state(self, corpus: str) -> CorpusState:
        raise NotImplementedError

    def _ensure_fresh(self, state: CorpusState) -> None:
        raise NotImplementedError

    def search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        """Top-k cosine matches among the allowed revisions only, best first.

        Rows outside `allowed` (or the namespace, or the filters) never enter the similarity
        product. `cancel` is checked before each batch of at most `scan_batch_rows` rows.
        """
        state = self._state(corpus)
        unit_query = query_unit(query, state.dimensions)
        if k <= 0 or not allowed:
            return []
        self._ensure_fresh(state)
        with self._segment(state, namespace, allowed, filters, cancel) as segment:
            scan = None if segment is None else segment.capture(allowed, filters)
            plan = None
            if segment is not None and scan is not None and filters is None:
                plan = approximate.plan(segment, scan, self._approximate_min_rows, self._graphs)
        if scan is None:
            return []
        if plan is None:
            rows, scores = self._exact(scan, unit_query, k, cancel)
        else:
            rows, scores = self._approximate(plan, scan, unit_query, k, cancel)
        # The best k, scored again as `dense_scores` scores (`cosines`: the same value to the
        # last bit); best first, equal scores in row order, so results are deterministic.
        chosen = rows[np.lexsort((rows, -scores))[:k]]
        exact = cosines(scan.matrix[chosen], unit_query)
        order = sorted(range(len(exact)), key=lambda i: (-exact[i], int(chosen[i])))
        found = scan.rows.many([int(chosen[i]) for i in order])
        ranked = [_candidate(row, exact[i]) for row, i in zip(found, order, strict=True)]
        return ranked if plan is None else ApproximateRanking(ranked)

    @contextmanager
    def _segment(
        self,
        state: CorpusState,
        namespace: str,
        allowed: Mapping[str, str],
        filters: MetadataFilter | None,
        cancel: CancelToken,
    ) -> Iterator[Segment | None]:
        """The namespace's segment, under the cache lock, with the filter's verdicts for the
        allowed revisions reached outside it (`segment.decide`). A write between the two
        holds leaves new revisions undecided: they are decided the same way, and the block
        runs only once every allowed revision of the segment then held has its verdict."""
        if filters is None:
            with locked(self._cache_lock, "the store's index"):
                yield state.segments.get(namespace)
            return
        decided: Verdicts = {}
        while True:
            with locked(self._cache_lock, "the store's index"):
                segment = state.segments.get(namespace)
                pending = [] if segment is None else segment.undecided(allowed, filters, decided)
                if not pending:
                    yield segment
                    return
            decide(pending, filters, decided, cancel)

    def _exact(
        self, scan: Scan, query: Matrix, k: int, cancel: CancelToken
    ) -> tuple[Index, Matrix]:
        """Every captured row scored: (matrix rows, scores) of the best k of each thread."""
        gathered = self._grants.rows(scan)
        scored = scan if gathered is None else Scan.contiguous(gathered, scan.rows)
        positions, scores = self._scanner.scan(scored, query, k, cancel)
        return scan.row_numbers(positions), scores

    def _approximate(
        self, plan: approximate.Plan, scan: Scan, query: Matrix, k: int, cancel: CancelToken
    ) -> tuple[Index, Matrix]:
        """The graph's candidates re-scored, and the rows appended since its build scanned."""
        cancel.check()
        self._counters.add(approximate_searches=1)
        rows, scores = approximate.search(plan, scan, query, k)
        tail = scan.after(plan.graph.built)
        if tail is None:
            return rows, scores
        positions, tail_scores = self._scanner.scan(tail, query, k, cancel)
        tail_rows = tail.row_numbers(positions)
        return np.concatenate((rows, tail_rows)), np.concatenate((scores, tail_scores))

    def wait_for_graphs(self) -> None:
        """Wait for the approximate search graph being built, if any (tests, benchmarks)."""
        self._graphs.join()

    def _under_cache_lock(self, action: Callable[[], None]) -> None:
        with self._cache_lock:
            action()

    def lexical_search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        terms: Sequence[str],
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        """Top-k BM25 matches among the allowed revisions only, best first (see the port).

        Scored from the namespace's in-memory inverted index (`lexicon.Lexicon`): passages
        outside `allowed` (or the filters) are masked out before any score is ranked.
        `cancel` is checked before each query term's postings are scored.
        """
        state = self._state(corpus)
        if k <= 0 or not allowed or not terms:
            return []
        self._ensure_fresh(state)
        with self._segment(state, namespace, allowed, filters, cancel) as segment:
            capture = None if segment is None else segment.lexical_capture(allowed, terms, filters)
        if capture is None:
            return []
        lexical = state.descriptor.lexical
        ranked = score(capture, terms, Bm25(lexical.k1, lexical.b), k, cancel)
        found = capture.rows.many([slot for slot, _ in ranked])
        return [_candidate(row, value) for row, (_, value) in zip(found, ranked, strict=True)]

    def dense_scores(
        self,
        corpus: str,
        namespace: str,
        passages: Sequence[Candidate],
        query: Vectors,
        cancel: CancelToken,
    ) -> list[float | None]:
        """Each passage's cosine with the query, from the in-memory segment (see the port)."""
        state = self._state(corpus)
        unit_query = query_unit(query, state.dimensions)
        if not passages:
            return []
        cancel.check()
        self._ensure_fresh(state)
        with locked(self._cache_lock, "the store's index"):
            segment = state.segments.get(namespace)
            if segment is None:
                return [None] * len(passages)
            matrix, rows = segment.locate(passages)
        held = [r for r in rows if r is not None]
        values = iter(cosines(matrix[held], unit_query) if held else [])
        return [None if r is None else next(values) for r in rows]

    def lexical_scores(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        passages: Sequence[Candidate],
        terms: Sequence[str],
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[float | None]:
        """Each passage's BM25 score, from the namespace's inverted index, with the
        statistics `lexical_search` takes for this grant and these filters (see the port)."""
        state = self._state(corpus)
        if not passages:
            return []
        self._ensure_fresh(state)
        with self._segment(state, namespace, allowed, filters, cancel) as segment:
            if segment is None:
                return [None] * len(passages)
            capture, slots = segment.lexical_passages(allowed, filters, passages, terms)
        held = np.array([s for s in slots if s is not None], dtype=np.int64)
        values: Iterator[float] = iter(())
        if capture is not None:
            lexical = state.descriptor.lexical
            bm25 = Bm25(lexical.k1, lexical.b)
            values = iter(score_slots(capture, held, terms, bm25, cancel).tolist())
        return [None if s is None else next(values, 0.0) for s in slots]


def _candidate(row: Row, score: float) -> Candidate:
    source = row.source
    return Candidate(
        chunk_id=row.chunk_id,
        source_id=source.source_id,
        revision=source.revision,
        text=row.text.decode("utf-8"),
        location=row.location,
        document_sha256=source.document_sha256,
        score=score,
        metadata=source.metadata,
        media_type=source.media_type,
    )

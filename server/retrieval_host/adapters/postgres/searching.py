"""The search methods of `PgVectorStore` (dense, lexical, and the scores of named passages):
each borrows a pooled connection and runs `search.Searcher` or the lexical SQL (`lexical`).
Writes, corpora and schema stay in `vector_store.py`; this mixin declares what it uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retrieval_host.adapters.postgres import lexical
from retrieval_host.adapters.postgres.pool import ConnectionPool, transaction, translated
from retrieval_host.adapters.postgres.search import Searcher
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.ports import Candidate, Vectors


class PgSearch:
    """Search over the store's schema; `PgVectorStore` provides the pool and descriptors."""

    _pool: ConnectionPool
    _schema: str
    _searcher: Searcher
    _source_totals: lexical.SourceTotals

    def _descriptor(self, corpus: str) -> CorpusDescriptor:
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

        Rows outside `allowed` (or the namespace, or the filters) are excluded in SQL before
        any distance is ranked. `cancel` is checked before each batch of `scan_batch_rows`
        rows (before the index scan on the HNSW path). See `search.Searcher`.
        """
        descriptor = self._descriptor(corpus)
        return self._searcher.search(
            self._pool, descriptor, namespace, allowed, query, k, cancel, filters
        )

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

        The granted sources are selected in SQL before any passage is scored, as in `search`;
        scoring and ranking run in SQL from the stored term statistics (`lexical`).
        """
        descriptor = self._descriptor(corpus)
        if k <= 0 or not allowed or not terms:
            return []
        cancel.check()
        with (
            self._pool.connection() as conn,
            translated("searching"),
            transaction(conn, repeatable_read=True, read_only=True),
        ):
            return lexical.lexical_search(
                conn,
                self._schema,
                self._source_totals,
                descriptor,
                namespace,
                allowed,
                terms,
                k,
                cancel,
                filters,
            )

    def dense_scores(
        self,
        corpus: str,
        namespace: str,
        passages: Sequence[Candidate],
        query: Vectors,
        cancel: CancelToken,
    ) -> list[float | None]:
        """Each passage's cosine with the query, from its stored vector (see the port)."""
        descriptor = self._descriptor(corpus)
        return self._searcher.dense_scores(
            self._pool, descriptor, namespace, passages, query, cancel
        )

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
        """Each passage's BM25 score, from the stored term statistics of the passages
        `lexical_search` would rank for this grant and these filters (see the port)."""
        descriptor = self._descriptor(corpus)
        if not passages:
            return []
        cancel.check()
        with (
            self._pool.connection() as conn,
            translated("searching"),
            transaction(conn, repeatable_read=True, read_only=True),
        ):
            return lexical.lexical_scores(
                conn,
                self._schema,
                self._source_totals,
                descriptor,
                namespace,
                allowed,
                passages,
                terms,
                filters,
            )

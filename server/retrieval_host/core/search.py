"""`search_context` as the retrieval lifecycle's steps (`core.lifecycle`), pure.

- prepare: the request checked, its filters parsed, its corpus and source ids resolved;
- assert input: the request's own rules (`check_search_request`);
- authorize: the application's grant, narrowed to the requested sources (a source missing or
  at another revision looks exactly like an unauthorized one), then to fresh revisions;
- execute: the ranking over the allowed revisions only (`core.ranking.rank`);
- assert result: the grant asked again after the read (a candidate whose revision is no longer
  granted is dropped), then reranking (only passages the caller may read leave the host), the
  corpus's ranking policy, `minScore`, the limit and the byte budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from retrieval_host.core.budget import apply_byte_budget
from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import source_unavailable
from retrieval_host.core.filters import MetadataFilter, parse_filter
from retrieval_host.core.freshness import fresh_revisions
from retrieval_host.core.grants import authorize, authorize_or_none, searchable
from retrieval_host.core.models import (
    EmbeddingUsage,
    Hit,
    RerankUsage,
    Scope,
    SearchRequest,
    SearchResult,
    SourceRef,
)
from retrieval_host.core.ports import Candidate
from retrieval_host.core.query_embedding import QueryEmbedder
from retrieval_host.core.ranking import apply_policy, rank
from retrieval_host.core.rerank import rerank_candidates, wants_rerank
from retrieval_host.core.validation import check_search_request


@dataclass(frozen=True, slots=True)
class PreparedSearch:
    request: SearchRequest
    corpus: Corpus
    source_ids: tuple[str, ...] | None
    where: MetadataFilter | None


@dataclass(frozen=True, slots=True)
class SearchGrant:
    namespace: str
    allowed: Mapping[str, str]  # source id -> the one revision it may be read at
    scope: Scope
    retrieved_at: str
    reranking: bool


@dataclass(frozen=True, slots=True)
class Found:
    candidates: list[Candidate]
    scores: dict[str, dict[str, float]]
    usage: EmbeddingUsage


class CorpusSearch:
    """The host's own search of a corpus (`Retrieval[SearchRequest, ..., SearchResult]`)."""

    name = "search_context"

    def __init__(
        self,
        corpus: Callable[[str], Corpus],
        queries: Callable[[Corpus], QueryEmbedder],
        clock: Callable[[], str],
    ) -> None:
        self._corpus = corpus
        self._queries = queries
        self._clock = clock

    def prepare(self, request: SearchRequest, context: RequestContext) -> PreparedSearch:
        check_search_request(request)  # before parsing filters: its errors come first
        where = parse_filter(request.filters) if request.filters is not None else None
        ids = tuple(dict.fromkeys(request.source_ids)) if request.source_ids is not None else None
        return PreparedSearch(request, self._corpus(request.corpus), ids, where)

    def assert_input(self, prepared: PreparedSearch) -> None:
        check_search_request(prepared.request)

    def authorize(self, prepared: PreparedSearch, context: RequestContext) -> SearchGrant:
        corpus, ids = prepared.corpus, prepared.source_ids
        context.report("retrieval.authorization", corpus=corpus.id, check="before-read")
        grant = authorize(corpus, "search", ids, context)
        granted = searchable(grant)
        if ids is None:
            allowed = granted
        else:
            if any(sid not in granted for sid in ids):
                raise source_unavailable()
            allowed = {sid: granted[sid] for sid in ids}
            for sid, revision in allowed.items():
                stored = corpus.store.get_source(corpus.id, grant.namespace, sid)
                if stored is None or stored.revision != revision:
                    raise source_unavailable()  # missing looks exactly like unauthorized
        # After the grant (a denied caller learns nothing of the corpus), before any result:
        # insisting on a reranker the corpus lacks is refused whatever the grant holds.
        reranking = wants_rerank(corpus.reranker, prepared.request.rerank)
        retrieved_at = self._clock()
        max_age = prepared.request.max_age_s
        if max_age is not None and allowed:
            # With authorization, before ranking: a stale revision is never scored.
            indexed = corpus.store.indexed_at(corpus.id, grant.namespace, allowed.keys())
            allowed = fresh_revisions(allowed, indexed, retrieved_at, max_age)
        scope = Scope(corpus.id, corpus.version, grant.namespace)
        return SearchGrant(grant.namespace, allowed, scope, retrieved_at, reranking)

    def execute(
        self, prepared: PreparedSearch, grant: SearchGrant, context: RequestContext
    ) -> Found:
        if not grant.allowed:
            return Found([], {}, EmbeddingUsage())
        request, corpus = prepared.request, prepared.corpus
        # One more than the limit tells `truncated`; a reranked search sends more to rerank.
        wanted = request.limit + 1
        if grant.reranking:
            wanted = max(wanted, corpus.rerank.candidates)
        ranked, usage = rank(
            corpus,
            grant.namespace,
            grant.allowed,
            request,
            prepared.where,
            wanted,
            context,
            self._queries(corpus),
        )
        scores = {r.candidate.chunk_id: dict(r.scores) for r in ranked}
        return Found([r.candidate for r in ranked], scores, usage)

    def assert_result(
        self,
        prepared: PreparedSearch,
        grant: SearchGrant,
        found: Found,
        context: RequestContext,
    ) -> SearchResult:
        request, corpus = prepared.request, prepared.corpus
        if not grant.allowed:
            return SearchResult([], False, grant.retrieved_at, grant.scope, found.usage)
        context.report("retrieval.authorization", corpus=corpus.id, check="after-read")
        recheck = authorize_or_none(corpus, "search", prepared.source_ids, context)
        candidates = found.candidates
        if recheck is None or recheck.namespace != grant.namespace:
            candidates = []
        else:
            candidates = [c for c in candidates if recheck.sources.get(c.source_id) == c.revision]
        scores = found.scores
        rerank_usage = RerankUsage()
        if grant.reranking and candidates and corpus.reranker is not None:
            # After the second check: only passages the caller may read leave the host.
            context.report("retrieval.rerank", corpus=corpus.id, documents=len(candidates))
            candidates, reranked, rerank_usage = rerank_candidates(
                corpus.reranker, request.query, candidates, context.cancel
            )
            for chunk_id, value in reranked.items():
                scores[chunk_id]["rerank"] = value
        if corpus.ranking_policy is not None:
            candidates = apply_policy(corpus.ranking_policy, request.query, candidates)
        if request.min_score is not None:
            candidates = [c for c in candidates if c.score >= request.min_score]

        shown = candidates[: request.limit]
        times = corpus.store.indexed_at(corpus.id, grant.namespace, {c.source_id for c in shown})
        hits = [
            Hit(
                chunk_id=c.chunk_id,
                source=SourceRef(c.source_id, c.revision),
                location=c.location,
                text=c.text,
                document_sha256=c.document_sha256,
                score=c.score,
                retrieved_at=grant.retrieved_at,
                scope=grant.scope,
                scores=scores[c.chunk_id],
                metadata=c.metadata,
                indexed_at=_indexed_at(times, c.source_id, c.revision),
            )
            for c in shown
        ]
        kept, dropped = apply_byte_budget(hits, request.max_context_bytes)
        truncated = dropped or len(candidates) > request.limit
        return SearchResult(
            kept, truncated, grant.retrieved_at, grant.scope, found.usage, rerank_usage
        )


def _indexed_at(
    times: Mapping[str, tuple[str, str | None]], source_id: str, revision: str
) -> str | None:
    """A hit's commit time, when the store still has its revision current."""
    found = times.get(source_id)
    return found[1] if found is not None and found[0] == revision else None

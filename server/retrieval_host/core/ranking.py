"""The ranking of a search in its mode: dense, lexical, or both fused (`core.fusion`).

Called by `RetrievalService.search_context` over revisions it has already authorized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.fusion import Ranked, for_model, fuse_settled, missing, single
from retrieval_host.core.lexical import query_terms
from retrieval_host.core.models import EmbeddingUsage, SearchRequest
from retrieval_host.core.ports import ApproximateRanking, Candidate, RankingPolicy, Vectors
from retrieval_host.core.query_embedding import QueryEmbedder

__all__ = ["apply_policy", "rank"]


def rank(
    corpus: Corpus,
    namespace: str,
    allowed: Mapping[str, str],
    request: SearchRequest,
    where: MetadataFilter | None,
    wanted: int,
    context: RequestContext,
    queries: QueryEmbedder,
) -> tuple[list[Ranked], EmbeddingUsage]:
    """The request's ranking over the allowed revisions (already authorized) whose metadata
    pass `where` (the request's parsed filters), at most `wanted` long, and what the query
    embedding cost (`queries`: the corpus's embedding, batched and cached)."""
    context.cancel.check()
    store, terms = corpus.store, query_terms(request.query, corpus.analyzer)
    if request.mode == "lexical":
        context.report("retrieval.scan", corpus=corpus.id, sources=len(allowed))
        lexical = store.lexical_search(
            corpus.id, namespace, allowed, terms, wanted, context.cancel, where
        )
        context.cancel.progress()
        return single("lexical", lexical), EmbeddingUsage()
    context.report("retrieval.embedding", corpus=corpus.id, inputs=1)
    batch = queries.embed(request.query, context.subject, context.cancel)
    vector = batch.vectors[0]
    context.cancel.progress()
    context.report("retrieval.scan", corpus=corpus.id, sources=len(allowed))
    if request.mode == "dense":
        dense = store.search(corpus.id, namespace, allowed, vector, wanted, context.cancel, where)
        context.cancel.progress()
        if isinstance(dense, ApproximateRanking):
            dense = _with_lexical(
                corpus, namespace, allowed, terms, where, wanted, dense, vector, context
            )
        return single("dense", dense), batch.usage
    # Hybrid takes more candidates from each ranking than it returns: fusion reorders them.
    # Past the scaling depth almost every search reads deeper (SciFact at limit 100: 804 of
    # 809 queries, bench/README.md session 41), so such a search starts there.
    depth = corpus.fusion.candidates
    if wanted > depth:
        depth = min(wanted * _GROWTH, max(_MAX_DEPTH, wanted))
    fusion = for_model(corpus.fusion, corpus.embedding.descriptor.model)
    while True:
        dense, lexical, completed = _both(
            corpus, namespace, allowed, terms, where, depth, vector, context
        )
        ranked, settled = fuse_settled(dense, lexical, fusion, completed, depth, wanted)
        if settled or depth >= _MAX_DEPTH:
            return ranked, batch.usage
        # A passage below both lists could still outrank the last hit: read deeper, so a
        # smaller limit's hits are the first of a larger one's (probe H, session 40: limit 49
        # and 55 disagreed on 4 of 25 queries, the deeper read's passages in between).
        depth = min(depth * _GROWTH, _MAX_DEPTH)


# The deepest hybrid reads each list (the largest fusion depth a corpus may set): past it, a
# result is the best of the first 1,000 of each ranking.
_MAX_DEPTH = 1000
# How much deeper each further read goes.
_GROWTH = 4


def _both(
    corpus: Corpus,
    namespace: str,
    allowed: Mapping[str, str],
    terms: Sequence[str],
    where: MetadataFilter | None,
    depth: int,
    vector: Vectors,
    context: RequestContext,
) -> tuple[list[Candidate], list[Candidate], dict[str, dict[str, float]]]:
    """Both rankings read `depth` deep, and for a convex fusion the score of each candidate
    in the mode whose list missed it."""
    store, cancel = corpus.store, context.cancel
    dense = store.search(corpus.id, namespace, allowed, vector, depth, cancel, where)
    cancel.progress()
    lexical = store.lexical_search(corpus.id, namespace, allowed, terms, depth, cancel, where)
    cancel.progress()
    completed: dict[str, dict[str, float]] = {}
    if corpus.fusion.method == "convex":
        # Every candidate scored in both modes: the store scores, in the mode that did not
        # rank it, each candidate drawn from the other (already authorized) list.
        no_dense, no_lexical = missing(dense, lexical)
        if no_dense:
            values = store.dense_scores(corpus.id, namespace, no_dense, vector, cancel)
            completed["dense"] = _known(no_dense, values)
        if no_lexical:
            # The grant and filters of the lexical search: its statistics, not the namespace's.
            values = store.lexical_scores(
                corpus.id, namespace, allowed, no_lexical, terms, cancel, where
            )
            completed["lexical"] = _known(no_lexical, values)
        cancel.progress()
    return dense, lexical, completed


def _with_lexical(
    corpus: Corpus,
    namespace: str,
    allowed: Mapping[str, str],
    terms: Sequence[str],
    where: MetadataFilter | None,
    wanted: int,
    dense: Sequence[Candidate],
    vector: Vectors,
    context: RequestContext,
) -> list[Candidate]:
    """An approximate dense ranking with the lexical index's best (the fusion depth) added,
    each scored by its exact cosine, best first. A graph among many near-identical passages
    can leave others out of reach, even of a query that is their own text (black-box probe U:
    20 of 300 missed at 20,300 passages, best cosines 0.75-0.92); the words still find them.
    (Convex hybrid searches score both lists in both modes anyway: `fusion`.)"""
    store, cancel = corpus.store, context.cancel
    depth = max(wanted, corpus.fusion.candidates)  # as deep as hybrid reads it
    lexical = store.lexical_search(corpus.id, namespace, allowed, terms, depth, cancel, where)
    extra, _ = missing(dense, lexical)
    if not extra:
        return list(dense)
    values = store.dense_scores(corpus.id, namespace, extra, vector, cancel)
    cancel.progress()
    scored = [replace(c, score=v) for c, v in zip(extra, values, strict=True) if v is not None]
    # Equal scores (near-identical passages, the case this is for) in chunk id order, so the
    # cut at `wanted` does not depend on which of them the graph reached.
    return sorted([*dense, *scored], key=lambda c: (-c.score, c.chunk_id))[:wanted]


def _known(passages: Sequence[Candidate], values: Sequence[float | None]) -> dict[str, float]:
    """Chunk id -> the score the store gave it, for those it still holds."""
    return {p.chunk_id: v for p, v in zip(passages, values, strict=True) if v is not None}


def apply_policy(
    policy: RankingPolicy, query: str, candidates: Sequence[Candidate]
) -> list[Candidate]:
    """The policy's order of the candidates, keeping only the host's own candidates, once."""
    given = {c.chunk_id: c for c in candidates}
    kept: dict[str, Candidate] = {}
    for c in policy.order(query, list(candidates)):
        if c.chunk_id in given and c.chunk_id not in kept:
            kept[c.chunk_id] = given[c.chunk_id]
    return list(kept.values())

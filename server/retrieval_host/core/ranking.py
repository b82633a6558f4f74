"""The ranking of a search in its mode: dense, lexical, or both fused (`core.fusion`).

Called by `RetrievalService.search_context` over revisions it has already authorized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.fusion import Ranked, for_model, fuse, missing, single
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
    usage = EmbeddingUsage()
    dense: list[Candidate] = []
    lexical: list[Candidate] = []
    # Hybrid takes more candidates from each ranking than it returns: fusion reorders them.
    depth = max(wanted, corpus.fusion.candidates) if request.mode == "hybrid" else wanted
    context.cancel.check()
    store, terms = corpus.store, query_terms(request.query, corpus.analyzer)
    vector = None
    if request.mode != "lexical":
        context.report("retrieval.embedding", corpus=corpus.id, inputs=1)
        batch = queries.embed(request.query, context.subject, context.cancel)
        usage = batch.usage
        vector = batch.vectors[0]
        context.cancel.progress()
        context.report("retrieval.scan", corpus=corpus.id, sources=len(allowed))
        dense = store.search(corpus.id, namespace, allowed, vector, depth, context.cancel, where)
        context.cancel.progress()
    if request.mode != "dense":
        if request.mode == "lexical":
            context.report("retrieval.scan", corpus=corpus.id, sources=len(allowed))
        lexical = store.lexical_search(
            corpus.id, namespace, allowed, terms, depth, context.cancel, where
        )
        context.cancel.progress()
    if request.mode == "dense":
        if isinstance(dense, ApproximateRanking) and vector is not None:
            dense = _with_lexical(
                corpus, namespace, allowed, terms, where, wanted, dense, vector, context
            )
        return single("dense", dense), usage
    if request.mode == "lexical":
        return single("lexical", lexical), usage
    completed: dict[str, dict[str, float]] = {}
    if corpus.fusion.method == "convex" and vector is not None:
        # Every candidate scored in both modes: the store scores, in the mode that did not
        # rank it, each candidate drawn from the other (already authorized) list.
        no_dense, no_lexical = missing(dense, lexical)
        if no_dense:
            values = store.dense_scores(corpus.id, namespace, no_dense, vector, context.cancel)
            completed["dense"] = _known(no_dense, values)
        if no_lexical:
            # The grant and filters of the lexical search: its statistics, not the namespace's.
            values = store.lexical_scores(
                corpus.id, namespace, allowed, no_lexical, terms, context.cancel, where
            )
            completed["lexical"] = _known(no_lexical, values)
        context.cancel.progress()
    fusion = for_model(corpus.fusion, corpus.embedding.descriptor.model)
    return fuse(dense, lexical, fusion, completed, wanted), usage


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

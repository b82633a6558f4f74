"""Reranking: the authorized top candidates of a search, reordered by a reranking model (pure).

The service calls `rerank_candidates` after its second authorization check, so only passages
the caller may read are sent to the reranker, and only as many as the corpus's
`RerankSettings.candidates` (at least the request's limit + 1). Every candidate sent gets a
score back (`top_n` is the number of documents), so no hit mixes a reranker's score with a
fused one. What the reranker answers is checked here, whatever adapter produced it: one result
per document, no index twice or outside the documents, every score finite. Any failure is
`RERANK_FAILED`; the search fails rather than silently falling back to the fused order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import RerankUsage
from retrieval_host.core.ports import Candidate, Reranker, RerankScore
from retrieval_host.core.reasons import InvalidRequestReason, RerankFailedReason

__all__ = ["RerankSettings", "check_scores", "rerank_candidates", "wants_rerank"]


@dataclass(frozen=True, slots=True)
class RerankSettings:
    """How one corpus reranks: the fused (or single-mode) top `candidates` are sent."""

    candidates: int = 40

    def __post_init__(self) -> None:
        if isinstance(self.candidates, bool) or not 1 <= self.candidates <= 1000:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "rerank candidates must be 1..1000")


def wants_rerank(reranker: Reranker | None, requested: bool | None) -> bool:
    """Whether a search reranks: `requested` None means "when the corpus has a reranker"."""
    if requested is None:
        return reranker is not None
    if requested and reranker is None:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "this corpus has no reranker; search without rerank.",
            reason=InvalidRequestReason.RERANK_UNAVAILABLE,
        )
    return requested


def _fail(detail: str, reason: RerankFailedReason) -> RetrievalError:
    return RetrievalError(ErrorCode.RERANK_FAILED, detail, reason=reason)


def check_scores(results: Sequence[RerankScore], documents: int) -> list[float]:
    """The score of each document by its position, or `RERANK_FAILED` with the case's reason."""
    if len(results) != documents:
        raise _fail(
            f"the reranker returned {len(results)} results for {documents} documents.",
            RerankFailedReason.WRONG_COUNT,
        )
    scores: list[float | None] = [None] * documents
    for result in results:
        index, score = result.index, result.relevance_score
        if not 0 <= index < documents:
            raise _fail(
                f"the reranker returned index {index} for {documents} documents.",
                RerankFailedReason.INDEX_OUT_OF_RANGE,
            )
        if scores[index] is not None:
            raise _fail(
                f"the reranker returned index {index} twice.", RerankFailedReason.DUPLICATE_INDEX
            )
        if not math.isfinite(score):
            raise _fail(
                "the reranker returned a non-finite relevance score.",
                RerankFailedReason.NON_FINITE_SCORE,
            )
        scores[index] = float(score)
    # `documents` results, none twice and none out of range: every position is filled.
    return [s for s in scores if s is not None]


def rerank_candidates(
    reranker: Reranker, query: str, candidates: Sequence[Candidate], cancel: CancelToken
) -> tuple[list[Candidate], dict[str, float], RerankUsage]:
    """`candidates` reordered by the reranker's scores (best first; equal scores in chunk id
    order), each with that score as its `score`; the score by chunk id; what the call cost."""
    if not candidates:
        return [], {}, RerankUsage()
    cancel.check()
    batch = reranker.rerank(query, [c.text for c in candidates], len(candidates), cancel)
    cancel.progress()
    scores = check_scores(batch.results, len(candidates))
    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], candidates[i].chunk_id))
    reranked = [replace(candidates[i], score=scores[i]) for i in order]
    return reranked, {c.chunk_id: c.score for c in reranked}, batch.usage

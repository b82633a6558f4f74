"""Embedding a revision's passages in slices, so that the work reports how far it got.

An ingest streamed to its caller (`ingest.progress` events) and the command line's progress
bar both read these reports. A slice of 64 passages costs nothing in requests: the local model
embeds 32 at a time, and an OpenAI-compatible adapter's token limit per request (8,000 by
default) holds fewer than 64 full passages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import EmbeddingAdapter, EmbeddingBatch

__all__ = ["EMBED_SLICE", "embed_passages"]

EMBED_SLICE = 64


def embed_passages(
    embedding: EmbeddingAdapter, texts: Sequence[str], corpus: str, context: RequestContext
) -> EmbeddingBatch:
    """`embedding.embed(texts)` a slice at a time, reporting `index.embedding` with `done` and
    `total` passages after each (and once with `done=0` before the first)."""
    total = len(texts)
    context.report("index.embedding", corpus=corpus, done=0, total=total)
    parts = []
    usage = EmbeddingUsage()
    for start in range(0, total, EMBED_SLICE):
        context.cancel.check()
        batch = embedding.embed(texts[start : start + EMBED_SLICE], context.cancel)
        context.cancel.progress()
        parts.append(batch.vectors)
        usage = usage + batch.usage
        context.report(
            "index.embedding", corpus=corpus, done=min(start + EMBED_SLICE, total), total=total
        )
    vectors = np.concatenate(parts) if parts else np.empty((0, 0), dtype=np.float32)
    return EmbeddingBatch(vectors, usage)

"""Counting and embedding a revision's passages in slices: the work reports how far it got,
and a cancel (the ingest deadline, a disconnect) stops it between slices.

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

__all__ = ["COUNT_SLICE", "EMBED_SLICE", "count_passages", "embed_passages"]

EMBED_SLICE = 64
# Counting is ~50x cheaper than embedding, yet a 2 MB document's passages took seconds to count
# on a loaded host, after its ingest deadline had passed: the cancel is checked between slices.
COUNT_SLICE = 256


def count_passages(
    embedding: EmbeddingAdapter, texts: Sequence[str], context: RequestContext
) -> list[int]:
    """`embedding.count_tokens(texts)` a slice at a time, checking the cancel token before
    each slice (a deadline or a disconnect stops it within one slice)."""
    counts: list[int] = []
    for start in range(0, len(texts), COUNT_SLICE):
        context.cancel.check()
        counts += embedding.count_tokens(texts[start : start + COUNT_SLICE])
    return counts


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

"""Counting and embedding a revision's passages in slices: the work reports how far it got,
and a cancel (the ingest deadline, a disconnect) stops it between slices.

An ingest streamed to its caller (`ingest.progress` events) and the command line's progress
bar both read these reports. A slice of 64 passages costs nothing in requests: the local model
embeds 32 at a time, and an OpenAI-compatible adapter's token limit per request (8,000 by
default) holds fewer than 64 full passages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import ChunkInput, EmbeddingUsage, JSONScalar, SourceInfo
from retrieval_host.core.passage_context import (
    context_of,
    embedding_text,
    passage_context,
    shorter,
)
from retrieval_host.core.ports import EmbeddingAdapter, EmbeddingBatch

__all__ = ["COUNT_SLICE", "EMBED_SLICE", "count_passages", "embed_passages", "passage_contexts"]

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


def passage_contexts(
    embedding: EmbeddingAdapter,
    chunking: Mapping[str, JSONScalar],
    source: SourceInfo,
    chunks: Sequence[ChunkInput],
    context: RequestContext,
) -> tuple[list[str], list[int]]:
    """Each passage's context line (`core.passage_context`; all "" in a corpus without), its
    last parts dropped until the line and the passage fit the model's input together: a
    passage's own text is never cut from its vector to make room for its title. Also the
    indexes of the passages that do not fit even alone (they would be cut).

    Each passage is counted once as it will be embedded (with its line, if any); only one
    over the limit is counted again, with a shorter line, until it fits or has none.
    """
    if context_of(chunking) == "none":
        lines = [""] * len(chunks)
    else:
        lines = [passage_context(source.title, c.section_path, c.text) for c in chunks]
    limit = embedding.max_input_tokens
    pending = list(range(len(chunks)))
    too_long: list[int] = []
    while pending:
        texts = [embedding_text(lines[i], chunks[i].text) for i in pending]
        over: list[int] = []
        for i, tokens in zip(pending, count_passages(embedding, texts, context), strict=True):
            if tokens <= limit:
                continue
            if lines[i]:
                lines[i] = shorter(lines[i])
                over.append(i)
            else:
                too_long.append(i)
        pending = over
    return lines, sorted(too_long)

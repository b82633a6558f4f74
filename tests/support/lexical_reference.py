"""BM25 written out by hand (the Lucene variant bm25s uses): what the stores must match."""

from __future__ import annotations

import math
from collections import Counter

from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms, term_frequencies


def reference(
    namespace_docs: dict[str, list[str]],
    allowed: set[str],
    query: str,
    *,
    k1: float = 0.9,
    b: float = 0.4,
) -> list[tuple[str, float]]:
    """(chunk id, score) best first, statistics (N, average length, df) over the passages of
    the `allowed` sources only: what the search may rank, never the rest of the namespace."""
    passages = {
        f"{sid}:{i}": term_frequencies(text, DEFAULT_ANALYZER)
        for sid, texts in namespace_docs.items()
        if sid in allowed
        for i, text in enumerate(texts)
    }
    n = len(passages)
    average = sum(sum(tf.values()) for tf in passages.values()) / n
    df = Counter(term for tf in passages.values() for term in tf)
    scored = []
    for chunk_id, tf in passages.items():
        length = sum(tf.values())
        score = sum(
            count
            * math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * tf[t]
            / (tf[t] + k1 * (1 - b + b * length / average))
            for t, count in Counter(query_terms(query, DEFAULT_ANALYZER)).items()
            if t in tf
        )
        if score > 0:
            scored.append((chunk_id, score))
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))

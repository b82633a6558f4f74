"""Builders for store-level tests: descriptors, random unit vectors and whole source revisions."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from retrieval_host.core.descriptor import CorpusDescriptor, EmbeddingDescriptor
from retrieval_host.core.models import JSONValue, Location
from retrieval_host.core.ports import StoredChunk, StoredSource

DIM = 8


def descriptor(corpus_id: str = "c1", dimensions: int = DIM, **chunking: str) -> CorpusDescriptor:
    """A store-level corpus descriptor for precomputed random vectors (no embedding model)."""
    embedding = EmbeddingDescriptor(
        provider_id="test-vectors",
        vendor="test",
        account_id="none",
        auth_mode="none",
        model="random-unit",
        dimensions=dimensions,
    )
    return CorpusDescriptor(corpus_id, "passages-v1", embedding, dict(chunking))


def unit_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    """`n` random unit rows (float32)."""
    raw = rng.standard_normal((n, dim))
    unit: npt.NDArray[np.float32] = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def revision_text(source_id: str, revision: str, ordinal: int, count: int) -> str:
    """Passage text that names its source, revision, position and the revision's size."""
    return f"source={source_id} revision={revision} chunk={ordinal}/{count}"


def revision(
    source_id: str,
    rev: str,
    vectors: npt.NDArray[np.float32],
    *,
    metadata: Mapping[str, JSONValue] | None = None,
    texts: Sequence[str] | None = None,
    chunk_ids: Sequence[str] | None = None,
) -> tuple[StoredSource, list[StoredChunk]]:
    """One complete source revision with one passage per row of `vectors`."""
    count = len(vectors)
    texts = (
        texts
        if texts is not None
        else [revision_text(source_id, rev, i, count) for i in range(count)]
    )
    ids = chunk_ids if chunk_ids is not None else [f"{source_id}:{i}" for i in range(count)]
    document = "\n\n".join(texts)
    digest = hashlib.sha256(document.encode()).hexdigest()
    fingerprint = hashlib.sha256(f"{source_id}\0{rev}\0{document}".encode()).hexdigest()
    source = StoredSource(
        source_id=source_id,
        revision=rev,
        title=f"Title of {source_id}",
        metadata=dict(metadata or {}),
        document_sha256=digest,
        fingerprint=fingerprint,
        chunk_count=count,
    )
    chunks = [
        StoredChunk(
            ids[i], i, texts[i], Location(page=1, start_line=i + 1, end_line=i + 1), vectors[i]
        )
        for i in range(count)
    ]
    return source, chunks

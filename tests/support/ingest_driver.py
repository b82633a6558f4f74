"""An in-process driver for ingestion tests: SQLite store on disk, local model, authorizer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.models import JSONScalar, Location
from retrieval_host.core.ports import (
    ANY_REVISION,
    AuthorizationRequest,
    EmbeddingAdapter,
    EmbeddingBatch,
    Grant,
)
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings

CORPUS = "handbook"
NAMESPACE = "team-a"


class CountingEmbedding:
    """Delegates to a real adapter and counts (and keeps) the texts it is asked to embed."""

    def __init__(self, inner: EmbeddingAdapter) -> None:
        self.inner = inner
        self.embed_calls = 0
        self.embedded_texts = 0
        self.texts: list[str] = []  # every text embedded, in order

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self.inner.descriptor

    @property
    def max_input_tokens(self) -> int:
        return self.inner.max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        self.embed_calls += 1
        self.embedded_texts += len(texts)
        self.texts += texts
        return self.inner.embed(texts, cancel)


@dataclass
class Library:
    """The application's authorizer: any source may be indexed; searches see `readable`."""

    readable: dict[str, str] = field(default_factory=dict)
    deny_all: bool = False
    calls: list[AuthorizationRequest] = field(default_factory=list)

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        self.calls.append(request)
        if self.deny_all:
            return None
        if request.operation == "index":
            return Grant(NAMESPACE, {sid: ANY_REVISION for sid in request.source_ids or ()})
        return Grant(NAMESPACE, dict(self.readable))


@dataclass
class Host:
    driver: Driver
    embedding: CountingEmbedding
    library: Library
    store: SqliteVectorStore

    @property
    def corpus(self) -> Corpus:
        return self.driver.retrieval.corpus(CORPUS)


def make_host(
    db: Path,
    embedding: LocalEmbedding,
    *,
    chunking: Mapping[str, JSONScalar] | None = None,
) -> Host:
    """A driver over a fresh (or existing) SQLite store at `db` with one corpus."""
    counting = CountingEmbedding(embedding)
    library = Library()
    store = SqliteVectorStore.open(db)
    identity = dict(chunking) if chunking is not None else ChunkingSettings().as_identity()
    corpus = Corpus(CORPUS, "passages-v1", counting, store, library, chunking=identity)
    return Host(Driver(RetrievalService([corpus])), counting, library, store)


def context(subject: str = "operator-1", cancel: CancelToken | None = None) -> RequestContext:
    return RequestContext(subject=subject, cancel=cancel or CancelToken())


IndexRow = tuple[str, str, str, str, Location, str]


def dump_index(host: Host, source_ids: Sequence[str]) -> list[IndexRow]:
    """Every stored passage of the sources: (source, revision, chunk id, text, location, sha).

    Read through the store port (the revision's rows, all of them), sorted so two stores can be
    compared chunk for chunk.
    """
    corpus = host.corpus
    allowed: dict[str, str] = {}
    for sid in source_ids:
        stored = corpus.store.get_source(CORPUS, NAMESPACE, sid)
        if stored is not None:
            allowed[sid] = stored.revision
    dimensions = corpus.embedding.descriptor.dimensions
    query = np.full(dimensions, 1.0 / math.sqrt(dimensions), dtype=np.float32)
    rows = corpus.store.search(CORPUS, NAMESPACE, allowed, query, 1_000_000, CancelToken())
    return sorted(
        (c.source_id, c.revision, c.chunk_id, c.text, c.location, c.document_sha256) for c in rows
    )


def sources(host: Host, source_ids: Sequence[str]) -> dict[str, tuple[str, int, str]]:
    """(revision, chunk count, fingerprint) of each stored source."""
    out: dict[str, tuple[str, int, str]] = {}
    for sid in source_ids:
        stored = host.corpus.store.get_source(CORPUS, NAMESPACE, sid)
        if stored is not None:
            out[sid] = (stored.revision, stored.chunk_count, stored.fingerprint)
    return out

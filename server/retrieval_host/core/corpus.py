"""A configured corpus (identity, embedding, store, the application's authorizer and effects)
and the event its commits report; `RetrievalService` serves a set of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from retrieval_host.core.descriptor import (
    CorpusDescriptor,
    LexicalDescriptor,
    stored_chunking,
    stored_lexical,
)
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.fusion import FusionSettings
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.passage_context import resolve_chunking
from retrieval_host.core.ports import (
    Authorizer,
    CapacityLimits,
    EmbeddingAdapter,
    RankingPolicy,
    Reranker,
    VectorStore,
)
from retrieval_host.core.rerank import RerankSettings

__all__ = ["CommitEvent", "Corpus", "utc_now"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class CommitEvent:
    operation: Literal["index", "delete"]
    corpus: str
    namespace: str
    source_id: str
    revision: str
    subject: str


@dataclass(frozen=True)
class Corpus:
    """A configured corpus: its identity, embedding, store and the application's authorizer."""

    id: str
    version: str
    embedding: EmbeddingAdapter
    store: VectorStore
    authorize: Authorizer
    limits: CapacityLimits = field(default_factory=CapacityLimits)
    # Settings of the ingestion helper that produced the passages; part of the index identity.
    # Without a `context` key, passage context is the stored corpus's choice (or the default
    # for a new corpus): the service opens the corpus with it resolved (`resolve_chunking`).
    chunking: Mapping[str, JSONScalar] = field(default_factory=dict)
    # Application effect after a committed index (also an `unchanged` confirmation, so a retry
    # heals a registry that missed the first call) or delete. It runs after the commit: an
    # exception here surfaces to the caller, but the mutation stands; retrying confirms it.
    on_committed: Callable[[CommitEvent], None] | None = None

    # BM25 analyzer and parameters (part of the index identity) and how `hybrid` fuses. None,
    # or an analyzer left None: the stored corpus's analyzer (and, for None, its k1 and b), or
    # the newest for a new corpus; the service opens the corpus with it resolved.
    lexical: LexicalDescriptor | None = None
    fusion: FusionSettings = field(default_factory=FusionSettings)
    # The model that reorders a search's authorized top candidates (`core.rerank`), pinned in
    # the descriptor like the embedding; None: searches are not reranked.
    reranker: Reranker | None = None
    rerank: RerankSettings = field(default_factory=RerankSettings)
    # The application's last word on a search's order (None: as ranked).
    ranking_policy: RankingPolicy | None = None
    # The adapter that embeds search queries, when not `embedding` itself: the same model
    # computed another way (`LocalEmbedding.queries` with int8 query arithmetic). Its
    # descriptor must be `embedding`'s: its vectors are searched against the stored ones.
    query_embedding: EmbeddingAdapter | None = None

    @property
    def analyzer(self) -> str:
        """The lexical analyzer of its passages and queries (`core.lexical`): as resolved by
        the service; before that, what a new corpus would get."""
        return self._lexical.chosen

    @property
    def _lexical(self) -> LexicalDescriptor:
        return (self.lexical or LexicalDescriptor()).resolved(None)

    @property
    def descriptor(self) -> CorpusDescriptor:
        return CorpusDescriptor(
            self.id,
            self.version,
            self.embedding.descriptor,
            self.chunking,
            self._lexical,
            self.reranker.descriptor if self.reranker is not None else None,
        )

    def resolved(self, stored: str | None) -> Corpus:
        """The corpus as it opens over `stored`, the descriptor its store holds (canonical
        JSON; None for a new corpus): the chunking and lexical settings its configuration
        leaves unset are the stored corpus's. Pure, so a start can compare a configuration with
        a store before opening (and migrating) it (`adapters.wiring.check_vector_store`)."""
        chunking = stored_chunking(stored) if stored is not None else None
        corpus = replace(self, chunking=resolve_chunking(self.chunking, chunking))
        try:
            previous = stored_lexical(stored) if stored is not None else None
        except RetrievalError as exc:
            raise RetrievalError(exc.code, f"corpus {corpus.id!r}: {exc.detail}") from None
        if corpus.lexical is None:
            return replace(corpus, lexical=previous or LexicalDescriptor().resolved(None))
        return replace(corpus, lexical=corpus.lexical.resolved(previous))

"""The ports core declares and adapters implement. Core never imports an adapter."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import (
    CorpusDescriptor,
    EmbeddingDescriptor,
    RerankDescriptor,
)
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.inspection import (
    PassageSummary,
    SourceSummary,
    SourceTotals,
    StoredPassage,
)
from retrieval_host.core.models import (
    EmbeddingUsage,
    Location,
    Metadata,
    Operation,
    RerankUsage,
)

Vectors = npt.NDArray[np.float32]

# In an `index` grant, a source mapped to this value may be written at any revision (the
# ingestion helper derives revisions from content, which the application cannot know ahead).
# It is refused in `search` and `delete` grants: those always name an exact revision.
ANY_REVISION = "*"


# --- authorization -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    operation: Operation
    corpus: str
    # None when the caller named no sources (a search over everything it may read).
    source_ids: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Grant:
    """What one subject may touch for one operation: a namespace and exact source revisions."""

    namespace: str
    sources: Mapping[str, str] = field(default_factory=dict)


Authorizer = Callable[[AuthorizationRequest, RequestContext], "Grant | None"]
"""Application code. Returns None to deny. Called again after reads (point-in-time checks)."""


# --- embedding -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbeddingBatch:
    vectors: Vectors  # shape (n, dimensions), float32, L2-normalised rows
    usage: EmbeddingUsage


class EmbeddingAdapter(Protocol):
    """Turns texts into unit vectors with one explicitly chosen model.

    Implementations validate what the model returns (count, order, dimensions, finiteness,
    non-zero) and never retry a failed request: a failure raises `EMBEDDING_FAILED`.
    """

    @property
    def descriptor(self) -> EmbeddingDescriptor: ...

    @property
    def max_input_tokens(self) -> int:
        """Tokens the model actually reads; longer inputs would be silently cut."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The model's own token count of each text (no truncation applied)."""
        ...

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch: ...


# --- reranking -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RerankScore:
    """One result of a reranker: the position of a document in the request, and its score."""

    index: int
    relevance_score: float


@dataclass(frozen=True, slots=True)
class RerankBatch:
    results: Sequence[RerankScore]  # as the reranker answered; `core.rerank` checks them
    usage: RerankUsage


class Reranker(Protocol):
    """Scores documents against a query with one explicitly chosen model.

    Only passages the caller is authorized to read are ever sent. An implementation parses
    what the service answers into `RerankScore`s (a wrong shape raises `RERANK_FAILED`);
    `core.rerank.apply_rerank` checks their count, indices and finiteness for every adapter.
    Nothing is retried.
    """

    @property
    def descriptor(self) -> RerankDescriptor: ...

    def rerank(
        self, query: str, documents: Sequence[str], top_n: int, cancel: CancelToken
    ) -> RerankBatch: ...


# --- vector store --------------------------------------------------------------------------


class ReadRevision(str):
    """A revision label as `VectorStore.get_source` read it, carrying the stored `version` of
    the write it was read from: a token of the store's own (opaque to core) that every write
    of the source changes, even one that brings the same label back.

    It is the label in every other respect (equal to it, hashed as it, shown as it), so core
    hands it on unchanged: given back to `replace_source` as `expected_revision`, it makes the
    commit conflict with any write committed since the read (a delete and re-create at the
    same label, a roll-back r1 -> r3 -> r1), not only with one that changed the label.
    """

    __slots__ = ("version",)
    version: str

    def __new__(cls, label: str, version: str) -> ReadRevision:
        read = super().__new__(cls, label)
        read.version = version
        return read

    def __reduce__(self) -> tuple[type[ReadRevision], tuple[str, str]]:
        return (ReadRevision, (str(self), self.version))


@dataclass(frozen=True, slots=True)
class StoredSource:
    source_id: str
    # A `ReadRevision` when `get_source` read it (the label and the version of its write).
    revision: str
    title: str
    metadata: Metadata
    document_sha256: str
    # SHA-256 over the canonical content *and* provenance of the revision: equal fingerprints
    # under one revision mean an identical re-index (`unchanged`), different ones a conflict.
    fingerprint: str
    chunk_count: int
    # Recorded with the revision, shown by inspection; None for rows written before they were.
    media_type: str | None = None  # the document's type when ingested from a raw document
    indexed_at: str | None = None  # when this revision was committed (RFC 3339, UTC)


@dataclass(frozen=True, slots=True)
class StoredChunk:
    chunk_id: str
    ordinal: int
    text: str
    location: Location
    vector: Vectors  # shape (dimensions,)
    # The passage's context line (`core.passage_context`), analyzed with its text for the
    # lexical index and not stored: "" in a corpus without passage context.
    context: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    chunk_id: str
    source_id: str
    revision: str
    text: str
    location: Location
    document_sha256: str
    score: float
    metadata: Metadata = field(default_factory=dict)  # the source's, as the hit shows it
    # The source revision's stored media type (`StoredSource.media_type`; None for prepared
    # passages): what decides whether the hit's metadata is narrowed (`core.passage_metadata`).
    media_type: str | None = None


class ApproximateRanking(list[Candidate]):
    """`VectorStore.search`'s answer when an approximate index (a graph) ranked it rather
    than the exact scan: the scores are exact, but the index may have missed a passage the
    exact scan would rank among them (a graph can leave points apart from a dense cluster
    hard to reach). Core then also scores the lexical index's best exactly (`core.ranking`).
    A plain list is an exact ranking."""


@dataclass(frozen=True, slots=True)
class CapacityLimits:
    max_passages_per_source: int = 10_000
    max_passage_bytes: int = 16_384
    max_corpus_payload_bytes: int = 2 * 1024**3


class VectorStore(Protocol):
    """Durable passages and vectors, partitioned by corpus and namespace.

    Contract (one suite runs it over every adapter):
    - `open_corpus` stores the descriptor on first use and raises `DESCRIPTOR_MISMATCH` on any
      difference later; it makes no embedding call.
    - `replace_source` swaps one whole revision atomically. It raises `SOURCE_CONFLICT`
      (`concurrent-writer`) if the current revision is no longer `expected_revision` (a racing
      writer; None: the source must not exist), `CHUNK_ID_CONFLICT` if a chunk id is used by
      another source in the namespace, `CAPACITY_EXCEEDED` if the corpus payload would pass its
      limit. On any error the previous revision stays. An `expected_revision` that is the
      `ReadRevision` `get_source` returned names the very write that was read: a write
      committed since conflicts even when it left the same label (a delete and re-create, a
      roll-back to an earlier label); a plain label is compared as a label only.
    - `search` ranks only rows whose source is in `allowed` at exactly that revision, inside the
      namespace (and matching `filters` on source metadata), *before* similarity ranking; it
      checks `cancel` between scan batches and returns at most `k` candidates, best first.
    - `lexical_search` ranks by BM25 (`core.lexical`) under the same rules as `search`: only
      allowed revisions in the namespace matching `filters`, selected *before* ranking; its
      term frequencies are written in the same transaction as the vectors, so a reader sees
      one whole revision, lexical and dense alike, and a delete removes both.
    - `current_revisions` answers from committed state only, commits of other connections and
      processes included, as soon as they commit; it never shows a revision that a failed or
      uncommitted write left behind.
    """

    def indexed_at(
        self, corpus: str, namespace: str, source_ids: Collection[str]
    ) -> dict[str, tuple[str, str | None]]:
        """Source id -> (current revision, when it was committed; None for revisions written
        before that was recorded), for those of `source_ids` that exist, from committed
        state. One statement however many ids (freshness, `core.freshness`)."""
        ...

    @property
    def read_only(self) -> bool:
        """Opened read-only (a snapshot, a replica): `replace_source` and `delete_source`
        raise `STORE_READ_ONLY` and change nothing, and `open_corpus` only checks."""
        ...

    def stored_descriptor(self, corpus: str) -> str | None:
        """The descriptor the corpus's first `open_corpus` stored (its canonical JSON), or
        None when it was never opened: read before opening, so that a setting the
        configuration leaves unset can take the stored corpus's value
        (`core.passage_context.resolve_chunking`)."""
        ...

    def open_corpus(self, descriptor: CorpusDescriptor) -> None: ...

    def get_source(self, corpus: str, namespace: str, source_id: str) -> StoredSource | None:
        """The committed current revision of a source, or None; its `revision` is a
        `ReadRevision` (the label and the version of the write it was read from)."""
        ...

    def replace_source(
        self,
        corpus: str,
        namespace: str,
        source: StoredSource,
        chunks: Sequence[StoredChunk],
        *,
        expected_revision: str | None,
        limits: CapacityLimits,
    ) -> None: ...

    def current_revisions(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None = None
    ) -> dict[str, str]:
        """The committed current revision of every source in one namespace of an opened
        corpus (source id -> revision; a new dict the caller owns), or of only `source_ids`
        when given (ids with nothing stored are absent). Cheap enough to call on every request
        (an application's authorizer does: the store is the truth about what is current)."""
        ...

    def delete_source(self, corpus: str, namespace: str, source_id: str, revision: str) -> int:
        """Delete exactly that revision; `SOURCE_UNAVAILABLE` if absent, `SOURCE_CONFLICT` if
        the source is at another revision. Returns the number of passages removed."""
        ...

    def search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        """Top-k passages by cosine similarity to `query` among the allowed revisions only
        (and the filters), best first, with exact scores. An answer an approximate index
        ranked is an `ApproximateRanking` (core then adds the lexical index's best, scored
        exactly); a plain list is the exact top k."""
        ...

    def lexical_search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        terms: Sequence[str],
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        """Top-k passages by BM25 for the analyzed query `terms` (`core.lexical.query_terms`;
        a repeated term counts per occurrence), among the allowed revisions only, best first;
        equal scores in chunk id order. Passages matching no term are not returned. Scores are
        BM25 values (>= 0, unbounded), comparable only within one query.

        Term statistics (passage count N, average passage length, document frequency df) are
        taken over exactly the passages this search may rank: the allowed revisions in the
        namespace that match `filters`, with the corpus's `k1` and `b`. So a passage's score
        depends only on passages its caller may read: adding, changing or deleting a source
        outside `allowed` (or outside the filters) never moves it, and scores tell nothing of
        what unreadable passages contain. (The price: the same passage can score differently
        under two grants; scores were never comparable across queries, now not across grants.)
        With every current revision of the namespace allowed, these are the namespace's
        statistics.
        """
        ...

    def dense_scores(
        self,
        corpus: str,
        namespace: str,
        passages: Sequence[Candidate],
        query: Vectors,
        cancel: CancelToken,
    ) -> list[float | None]:
        """The score `search` gives each of `passages` for `query` (equal within 1e-6), in
        their order; None for a passage whose source is no longer stored at the candidate's
        revision in the namespace. The passages are the caller's own candidates, drawn from
        an authorized search: hybrid fusion scores every candidate in both modes with this
        and `lexical_scores`. One statement (or one capture) however many passages."""
        ...

    def lexical_scores(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        passages: Sequence[Candidate],
        terms: Sequence[str],
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[float | None]:
        """The BM25 score `lexical_search(corpus, namespace, allowed, terms, k, cancel,
        filters)` gives each of `passages` (the statistics of that search's passages, read in
        one snapshot with the scores; 0.0 when no term matches), in their order. None for a
        passage that search could not rank: its source is no longer stored at the
        candidate's revision in the namespace, or it is not an allowed revision matching
        `filters`. Hybrid fusion passes the grant and filters of its own searches."""
        ...

    @property
    def reclamation(self) -> str:
        """What a delete does to stored bytes: `overwritten`, `pending` or `unknown`."""
        ...

    def close(self) -> None: ...

    # --- inspection (`core/inspection.py`) ------------------------------------------------
    # Like `search`, these read only sources in `allowed` at exactly that revision, inside the
    # namespace: a source at another revision, or outside `allowed`, does not exist for them.
    # Source ids order by code point (byte order of UTF-8), the same in every store.

    def list_sources(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        *,
        after: str | None,
        limit: int,
    ) -> list[SourceSummary]:
        """The allowed sources whose current revision is the allowed one, ordered by source
        id, those after `after` only (all when None), at most `limit`. `bytes` is the UTF-8
        size of the revision's passage text; `version` the version of the write it was read
        from, as `get_source`'s `ReadRevision.version` (a passage cursor names it)."""
        ...

    def source_totals(
        self, corpus: str, namespace: str, allowed: Mapping[str, str]
    ) -> SourceTotals:
        """Sources, passages and passage text bytes over what `list_sources` would list."""
        ...

    def list_passages(
        self,
        corpus: str,
        namespace: str,
        source_id: str,
        revision: str,
        *,
        after: int | None,
        limit: int,
    ) -> list[PassageSummary]:
        """The passages of exactly that source revision by ordinal, those after ordinal
        `after` only (all when None), at most `limit`; empty when the source is at another
        revision or absent."""
        ...

    def read_passage(
        self,
        corpus: str,
        namespace: str,
        chunk_id: str,
        readable: Callable[[str, str], bool],
    ) -> StoredPassage | None:
        """The stored passage with that chunk id in the namespace, or None when there is none
        or `readable(source_id, revision)` refuses its source revision.

        `readable` is asked once, before the passage's text and metadata are read, and nothing
        more is read when it refuses: a passage the caller may not read costs what a missing
        one costs (decoding a hidden source's metadata made the hidden id measurably slower).
        The answer is one snapshot: the passage returned is of the revision `readable` was
        asked about. It runs under the store's lock, so it must be cheap and do no I/O."""
        ...


class RankingPolicy(Protocol):
    """An application's last word on a search's order (`Corpus.ranking_policy`): given the
    authorized, ranked (and reranked) candidates, best first, it returns them reordered or
    thinned (a freshness boost, a per-source cap, a business rule).

    It runs after the second authorization check, on passages the caller may read; the host
    keeps only candidates it was given (a policy cannot add or alter a passage), then applies
    `minScore`, the limit and the byte budget."""

    def order(self, query: str, candidates: Sequence[Candidate]) -> Sequence[Candidate]: ...

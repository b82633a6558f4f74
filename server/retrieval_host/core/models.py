"""Domain values of the in-process API: immutable, no I/O, snake_case (HTTP maps to camelCase)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | Sequence["JSONValue"] | Mapping[str, "JSONValue"]
Metadata: TypeAlias = Mapping[str, JSONValue]

Operation: TypeAlias = Literal["search", "index", "delete"]
SearchMode: TypeAlias = Literal["hybrid", "dense", "lexical"]
SEARCH_MODES: frozenset[str] = frozenset({"hybrid", "dense", "lexical"})


@dataclass(frozen=True, slots=True)
class Location:
    """Where a passage came from inside its document (1-based pages and lines)."""

    page: int | None = None
    start_line: int | None = None
    end_line: int | None = None
    document_id: str | None = None


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """A source document revision as the application names it."""

    id: str
    revision: str
    title: str = ""
    metadata: Metadata = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChunkInput:
    id: str
    text: str
    location: Location = Location()
    # The heading path (or e-mail subject) of the passage's section, for its context line
    # (`core.passage_context`); not stored, not part of its identity.
    section_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class IndexRequest:
    corpus: str
    source: SourceInfo
    chunks: Sequence[ChunkInput]
    # SHA-256 of the full document text. Ingestion helpers pass the real document's digest;
    # for prepared passages it defaults to the digest of the passages joined by blank lines.
    document_sha256: str | None = None
    # The normalized media type of the raw document the passages came from (None: prepared).
    media_type: str | None = None


@dataclass(frozen=True, slots=True)
class SearchRequest:
    corpus: str
    query: str
    source_ids: Sequence[str] | None = None
    limit: int = 8
    max_context_bytes: int | None = None
    # Conditions on source metadata in their JSON form (`core.filters`), applied with
    # authorization before ranking.
    filters: Mapping[str, JSONValue] | None = None
    # How passages are ranked (`core.fusion`): both rankings fused by default.
    mode: SearchMode = "hybrid"
    # Hits whose final score (fused in `hybrid`, the reranker's when reranked) is below this
    # are left out (not `truncated`).
    min_score: float | None = None
    # Rerank the authorized top candidates with the corpus's reranker (`core.rerank`). None:
    # when the corpus has one; True on a corpus without one is refused.
    rerank: bool | None = None
    # Read only revisions committed at most this many seconds ago (`core.freshness`), chosen
    # with authorization before ranking. None: any age.
    max_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    corpus: str
    source_id: str
    revision: str


@dataclass(frozen=True, slots=True)
class EmbeddingUsage:
    """Embedding metering, kept apart from generation usage."""

    requests: int = 0
    input_tokens: int = 0

    def __add__(self, other: EmbeddingUsage) -> EmbeddingUsage:
        return EmbeddingUsage(
            self.requests + other.requests, self.input_tokens + other.input_tokens
        )


@dataclass(frozen=True, slots=True)
class RerankUsage:
    """Reranking metering: calls, documents sent, and tokens when the service reports them."""

    requests: int = 0
    documents: int = 0
    input_tokens: int = 0

    def __add__(self, other: RerankUsage) -> RerankUsage:
        return RerankUsage(
            self.requests + other.requests,
            self.documents + other.documents,
            self.input_tokens + other.input_tokens,
        )


@dataclass(frozen=True, slots=True)
class Scope:
    """Under what a read was made: the corpus, its index version and the granted namespace."""

    corpus: str
    index_version: str
    namespace: str


@dataclass(frozen=True, slots=True)
class SourceRef:
    id: str
    revision: str


@dataclass(frozen=True, slots=True)
class Hit:
    chunk_id: str
    source: SourceRef
    location: Location
    text: str
    document_sha256: str
    score: float
    retrieved_at: str
    scope: Scope
    # The score each search mode gave this passage (`dense`, `lexical`, and `rerank` when
    # reranked; a mode that did not rank it is absent). `score` is the final one (the
    # reranker's when reranked, else fused in `hybrid` mode).
    scores: Mapping[str, float] = field(default_factory=dict)
    # The source revision's metadata (as indexed), so that a hit shows what filters saw.
    metadata: Metadata = field(default_factory=dict)
    # When its revision was committed (None for revisions written before that was recorded).
    indexed_at: str | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: Sequence[Hit]
    truncated: bool
    retrieved_at: str
    scope: Scope | None
    usage: EmbeddingUsage
    rerank_usage: RerankUsage = field(default_factory=RerankUsage)


@dataclass(frozen=True, slots=True)
class IndexResult:
    corpus: str
    source: SourceRef
    status: Literal["indexed", "unchanged"]
    chunk_count: int
    document_sha256: str
    replaced_revision: str | None
    usage: EmbeddingUsage


@dataclass(frozen=True, slots=True)
class DeleteResult:
    corpus: str
    source: SourceRef
    deleted_chunks: int
    # Reclamation is reported apart from visibility: the passages are gone from every read as
    # soon as the delete commits; whether their bytes were overwritten is a store property.
    reclamation: Literal["overwritten", "pending", "unknown"]

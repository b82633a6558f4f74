"""The keyword form of each request, typed: `client.search_context(corpus=..., query=...)`.

Each method takes a request model, a mapping, or keywords; these `TypedDict`s give the keywords
their names and types (`**fields: Unpack[SearchFields]`), so a type checker refuses `qeury=` or
`limit="2"` before anything runs. The models stay the one validation: a nested value may be its
model or a plain mapping, as the models accept. A test keeps each one's keys equal to its model's
fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from retrieval_host_client.models import ChunkInput, SourceInput
from retrieval_host_client.run_models import (
    CitationPolicy,
    Fallbacks,
    OutputArtifactSpec,
    RunRetrieval,
)

__all__ = ["DeleteFields", "IndexFields", "RunFields", "SearchFields"]


class SearchFields(TypedDict, total=False):
    """`SearchRequest` as keywords."""

    corpus: str
    query: str
    source_ids: tuple[str, ...] | list[str] | None  # not a bare str, which is a Sequence
    limit: int
    max_context_bytes: int | None
    filters: Mapping[str, Any] | None
    mode: Literal["hybrid", "dense", "lexical"]
    min_score: float | None
    rerank: bool | None
    max_age_s: float | None


class IndexFields(TypedDict, total=False):
    """`IndexRequest` as keywords."""

    corpus: str
    source: SourceInput | Mapping[str, Any]
    chunks: Sequence[ChunkInput | Mapping[str, Any]]
    document_sha256: str | None


class DeleteFields(TypedDict, total=False):
    """`DeleteRequest` as keywords."""

    corpus: str
    source_id: str
    revision: str


class RunFields(TypedDict, total=False):
    """`RunRequest` as keywords."""

    provider: str
    model: str
    input: str
    retrieval: RunRetrieval | Mapping[str, Any] | None
    output_artifact: OutputArtifactSpec | Mapping[str, Any] | None
    idempotency_key: str | None
    idle_timeout_ms: int | None
    max_generation_steps: int
    citations: CitationPolicy | Mapping[str, Any] | None
    max_tokens: int | None
    fallbacks: Fallbacks | Mapping[str, Any] | None
    max_attempts: int

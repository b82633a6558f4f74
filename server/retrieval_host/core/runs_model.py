"""Values of grounded runs: requests, events, results, receipts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import (
    EmbeddingUsage,
    JSONValue,
    Location,
    RerankUsage,
    SearchMode,
)

RetrievalMode: TypeAlias = Literal["off", "before", "tool"]
ReceiptStatus: TypeAlias = Literal["ok", "failed", "duplicate", "quota-exceeded"]


@dataclass(frozen=True, slots=True)
class RunRetrieval:
    corpus: str
    mode: RetrievalMode = "before"
    source_ids: Sequence[str] | None = None
    # Standalone search requires a query; in a run it defaults to the run input.
    query: str | None = None
    limit: int = 6
    # Bytes of passage text all the run's searches may add to its evidence together.
    max_context_bytes: int | None = 32_768
    # Successful searches a run may make (the `tool` mode quota; `before` makes one).
    max_queries: int = 3
    # How each of its searches ranks (`SearchRequest.mode`).
    search_mode: SearchMode = "hybrid"
    # Whether its searches rerank (`SearchRequest.rerank`; None: when the corpus has a
    # reranker), and how many reranker calls the run may make: a search that would rerank
    # past them is not made (its receipt says `quota-exceeded`).
    rerank: bool | None = None
    max_rerank_calls: int = 3
    # Each search reads only revisions committed at most this many seconds ago.
    max_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class CitationPolicy:
    """The host checks the answer's citations before the run completes (`core.runs.citations`):
    every `[source:ID]` well formed and naming a passage of the run's manifest (which was
    re-authorized at its current revision just before), at least one when `require`, and,
    with `quotes`, the text the answer quotes next to a citation found in that passage. A
    failed check fails the run with `INVALID_CITATION`."""

    require: bool = True
    quotes: bool = True


@dataclass(frozen=True, slots=True)
class QuoteCheck:
    text: str  # as quoted in the answer
    found: bool  # occurs in the cited passage (whitespace-normalized)


@dataclass(frozen=True, slots=True)
class CitedSource:
    """One cited passage of a checked answer, with the quotes placed next to its markers."""

    id: str
    quotes: Sequence[QuoteCheck] = ()


@dataclass(frozen=True, slots=True)
class CitationReport:
    """What the host's citation check found: each cited passage, first citation first."""

    cited: Sequence[CitedSource]


@dataclass(frozen=True, slots=True)
class OutputArtifactSpec:
    name: str
    media_type: str = "text/markdown"


@dataclass(frozen=True, slots=True)
class RunRequest:
    provider: str
    model: str
    input: str
    retrieval: RunRetrieval | None = None
    output_artifact: OutputArtifactSpec | None = None
    idempotency_key: str | None = None
    idle_timeout_ms: int | None = None
    # Model calls the run may make; every call (also tool rounds) draws on it.
    max_generation_steps: int = 4
    # Check the answer's citations on the host before completing (None: not checked).
    citations: CitationPolicy | None = None
    # Tokens the whole run may spend: query embedding, reranking and generation (input and
    # output) together, checked before each search and each model call (None: no bound).
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One passage the run supplied to the model: what `[source:ID]` may cite."""

    id: str  # the chunk id
    source_id: str
    revision: str
    location: Location
    title: str = ""
    origin: Literal["retrieval"] = "retrieval"


@dataclass(frozen=True, slots=True)
class Receipt:
    """What one retrieval attempt inside a run did (failed attempts too)."""

    sequence: int
    query: str
    key: str
    started_at: str
    status: ReceiptStatus
    source_ids: Sequence[str] = ()  # chunk ids returned
    error_code: str | None = None
    search_mode: str | None = None  # None in receipts recorded before runs named it


@dataclass(frozen=True, slots=True)
class GenerationUsage:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: GenerationUsage) -> GenerationUsage:
        return GenerationUsage(
            self.requests + other.requests,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
        )


@dataclass(frozen=True, slots=True)
class RunUsage:
    generation: GenerationUsage = field(default_factory=GenerationUsage)
    embedding: EmbeddingUsage = field(default_factory=EmbeddingUsage)
    rerank: RerankUsage = field(default_factory=RerankUsage)


@dataclass(frozen=True, slots=True)
class OutputArtifact:
    name: str
    media_type: str
    source_ids: Sequence[str]


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    status: Literal["completed"]
    provider: str
    model: str
    text: str
    sources: Sequence[ManifestEntry]
    receipts: Sequence[Receipt]
    usage: RunUsage
    created_at: str
    completed_at: str
    artifact: OutputArtifact | None = None
    # The corpus the evidence came from (needed to re-authorize it on replay).
    corpus: str | None = None
    replayed: bool = False
    # The host's citation check, when the request asked for one.
    citations: CitationReport | None = None


# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunStarted:
    run_id: str
    created_at: str
    type: Literal["run.started"] = "run.started"


@dataclass(frozen=True, slots=True)
class RunProgress:
    phase: str
    context: Mapping[str, JSONValue] = field(default_factory=dict)
    type: Literal["run.progress"] = "run.progress"


@dataclass(frozen=True, slots=True)
class RunDelta:
    text: str
    type: Literal["run.delta"] = "run.delta"


@dataclass(frozen=True, slots=True)
class RunCompleted:
    result: RunResult
    type: Literal["run.completed"] = "run.completed"


@dataclass(frozen=True, slots=True)
class RunFailed:
    run_id: str
    error: RetrievalError
    type: Literal["run.failed"] = "run.failed"


RunEvent: TypeAlias = RunStarted | RunProgress | RunDelta | RunCompleted | RunFailed

"""Wire models of grounded runs (`POST /v1/runs`, `GET /v1/runs/{id}`, and the SSE events)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BeforeValidator, Field, JsonValue, StringConstraints

from retrieval_host_client.models import (
    NOT_BLANK,
    TEXT_PATTERN,
    EmbeddingUsage,
    Filters,
    Identifier,
    Limit,
    Location,
    Positive,
    Problem,
    QueryText,
    RerankUsage,
    Score,
    SourceRef,
    _integral,
    _Request,
    _Response,
    known_values,
)

__all__ = [
    "CitationPolicy",
    "CitationReport",
    "CitedSource",
    "FallbackAnswer",
    "FallbackTaken",
    "Fallbacks",
    "GenerationUsage",
    "ManifestEntry",
    "OutputArtifact",
    "OutputArtifactSpec",
    "QuoteCheck",
    "Receipt",
    "RetrievalState",
    "RunCompletedEvent",
    "RunDeltaEvent",
    "RunEvent",
    "RunFailedEvent",
    "RunProgressEvent",
    "RunRecord",
    "RunRequest",
    "RunResult",
    "RunRetrieval",
    "RunStartedEvent",
    "RunUsage",
]

Label = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
# A model name may also hold `@` (Vertex AI's `claude-3-5-sonnet-v2@20241022`).
ModelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"),
]
InputText = Annotated[str, StringConstraints(min_length=1, max_length=16_384, pattern=NOT_BLANK)]

# The values of protocol v1 in the open response fields (`models.known_values`): a newer host
# may send others, which the client passes on instead of refusing the answer.
ManifestOrigin: TypeAlias = Literal["retrieval"]
ReceiptStatus: TypeAlias = Literal["ok", "failed", "duplicate", "quota-exceeded"]
RunStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled"]
FinishReason: TypeAlias = Literal["stop", "length", "content-filter", "other"]


class RunRetrieval(_Request):
    """Which corpus grounds the run and how: `before` searches once, `tool` lets the model
    search within `maxQueries`, `off` generates without evidence."""

    corpus: Identifier
    mode: Literal["off", "before", "tool"] = "before"
    # A tuple, as every sequence in a request model: a type checker takes `("a", "b")`
    # without pydantic's plugin, and the frozen model can be hashed (a list cannot be).
    source_ids: Annotated[tuple[Identifier, ...], Field(max_length=10_000)] | None = None
    query: QueryText | None = None
    limit: Limit = 6
    max_context_bytes: Positive | None = 32_768
    max_queries: Annotated[int, Field(ge=0, le=16), BeforeValidator(_integral)] = 3
    # How each search ranks: `hybrid` (vector and lexical fused), `dense` or `lexical`.
    search_mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    # Rerank each search's authorized top candidates (None: when the corpus has a reranker);
    # a search that would call the reranker past `maxRerankCalls` is not made.
    rerank: bool | None = None
    max_rerank_calls: Annotated[int, Field(ge=0, le=16), BeforeValidator(_integral)] = 3
    # Each search reads only revisions committed at most this many seconds ago.
    max_age_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    # Each search keeps only sources whose metadata pass these filters (as a search's).
    filters: Filters | None = None
    # Each search keeps only hits scoring at least this, in its mode's scale (as a search's
    # `minScore`): a `before` run left without evidence fails NO_RETRIEVAL_EVIDENCE.
    min_score: Annotated[float, Field(allow_inf_nan=False)] | None = None


class OutputArtifactSpec(_Request):
    name: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=TEXT_PATTERN)]
    media_type: Annotated[
        str, StringConstraints(min_length=1, max_length=128, pattern=TEXT_PATTERN)
    ] = "text/markdown"


class CitationPolicy(_Request):
    """Ask the host to check the answer's citations before the run completes: every
    `[source:ID]` well formed and in the run's manifest (re-authorized at its current
    revision), at least one when `require`, and with `quotes` every text quoted next to a
    citation found in that passage (whitespace-normalized, compatibility forms such as
    ligatures folded, a word hyphenated at a line end matched hyphenated or joined). A failed
    check fails the run with `INVALID_CITATION` (reasons `malformed-marker`,
    `unknown-source`, `no-citation`, `quote-not-in-passage`)."""

    require: bool = True
    quotes: bool = True


class FallbackAnswer(_Request):
    """Complete the run with this fixed reply instead (it cites nothing)."""

    answer: InputText


FallbackChoice = Literal["fail", "continue"] | FallbackAnswer


class Fallbacks(_Request):
    """What the run does per outcome instead of failing (each `fail` by default):
    `noEvidence` (no authorized passage; `continue` generates without evidence),
    `searchFailed` (no passage, and a search did not answer: its source or grant was not there,
    or it failed; unset, it is handled as `noEvidence`; `fail` fails with that search's code),
    `sourceUnavailable` (evidence revoked before recording; `continue` records without it),
    `invalidCitation` (the host's citation check failed; `continue` completes with the answer
    and the failure in `citations.failure`), `answerRejected` (the application's verifier
    rejected the answer; `continue` completes with it and `verification: "rejected"`).
    `{"answer": ...}` completes with a fixed reply."""

    no_evidence: FallbackChoice = "fail"
    source_unavailable: FallbackChoice = "fail"
    invalid_citation: FallbackChoice = "fail"
    search_failed: FallbackChoice | None = None
    answer_rejected: FallbackChoice = "fail"


class RunRequest(_Request):
    """A grounded generation request. `provider` must be granted to the caller's token."""

    provider: Label
    model: ModelName
    input: InputText
    retrieval: RunRetrieval | None = None
    output_artifact: OutputArtifactSpec | None = None
    idempotency_key: (
        Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=TEXT_PATTERN)] | None
    ) = None
    # Expiry is the client's own limit: `TIMEOUT` 408 (reason `idle-timeout`), never a 5xx.
    idle_timeout_ms: Positive | None = None
    max_generation_steps: Annotated[int, Field(ge=1, le=16), BeforeValidator(_integral)] = 4
    citations: CitationPolicy | None = None
    # Tokens the whole run may spend (query embedding, reranking, generation in and out),
    # checked before each search and model call: spent, a search is not made
    # (`quota-exceeded`) and a model call is `INVALID_REQUEST` / `token-budget-exhausted`.
    max_tokens: Positive | None = None
    fallbacks: Fallbacks | None = None
    # Attempts per model call: a rate limit, a server error, a dropped connection or a timeout
    # is asked again (with a backoff) while nothing of that call's answer has streamed.
    max_attempts: Annotated[int, Field(ge=1, le=5), BeforeValidator(_integral)] = 1


class ManifestEntry(_Response):
    """A passage the run supplied to the model; `id` is what `[source:ID]` cites."""

    id: str
    origin: Annotated[ManifestOrigin | str, known_values(ManifestOrigin)]
    source: SourceRef
    title: str = ""
    location: Location


class RawHit(_Response):
    """One hit of a run's search as the search returned it."""

    chunk_id: str
    score: Score


class Receipt(_Response):
    """One retrieval attempt inside a run, failed attempts included."""

    sequence: int
    query: str
    key: str
    started_at: str
    status: Annotated[ReceiptStatus | str, known_values(ReceiptStatus)]
    source_ids: list[str]
    error_code: str | None = None
    search_mode: str | None = None  # the search's mode; None for runs recorded before
    # evidence, empty, unavailable, failed, duplicate or quota-exceeded.
    outcome: str | None = None
    raw_query: str | None = None  # the query as sent (`query` is it normalized)
    success: int | None = None  # 1, 2, 3 for successful searches only
    # What the application's effects returned after the search, by name; the one that failed.
    extensions: dict[str, JsonValue] = Field(default_factory=dict)
    effect_error: dict[str, str] | None = None
    # The raw result: every hit the search returned, in order, with its score (`source_ids`
    # is what of it joined the run's evidence); empty for runs recorded before.
    raw_hits: list[RawHit] = Field(default_factory=list)


class RetrievalState(_Response):
    """A run's retrieval at its end: successful searches against the quota, the dedup keys
    used, and the sources of its evidence."""

    query_count: int
    max_queries: int
    seen: list[str]
    sources: list[str]


class GenerationUsage(_Response):
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class RunUsage(_Response):
    generation: GenerationUsage
    embedding: EmbeddingUsage
    rerank: RerankUsage = Field(default_factory=RerankUsage)


class OutputArtifact(_Response):
    name: str
    media_type: str
    source_ids: list[str]


class QuoteCheck(_Response):
    text: str
    found: bool


class CitedSource(_Response):
    """A passage the checked answer cites, with the quotes placed next to its markers."""

    id: str
    quotes: list[QuoteCheck] = Field(default_factory=list)


class CitationReport(_Response):
    """The host's citation check of the answer (`RunRequest.citations`), first cited first."""

    cited: list[CitedSource]
    failure: str | None = None  # the check's reason, when the run continued past it


class FallbackTaken(_Response):
    """A declared fallback the run took: `outcome` no-evidence, search-failed,
    source-unavailable, invalid-citation or answer-rejected; `action` continue or answer."""

    outcome: str
    action: str


class RunResult(_Response):
    """A completed run: the answer, what it may cite, how it searched, and what it cost.

    `finish_reason` says how the answer ended: `"stop"` (the model ended it), `"length"` (cut
    at the output-token limit: `maxOutputTokens` or the model's own), `"content-filter"` (a
    provider's filter cut it) or `"other"`; None for a run recorded before hosts kept it
    (unknown). A run completes whichever it is: check it before showing `text` as a whole
    answer."""

    run_id: str
    status: Literal["completed"]
    provider: str
    model: str
    text: str
    finish_reason: Annotated[FinishReason | str, known_values(FinishReason)] | None = None
    sources: list[ManifestEntry]
    receipts: list[Receipt]
    usage: RunUsage
    artifact: OutputArtifact | None = None
    corpus: str | None = None
    created_at: str
    completed_at: str
    replayed: bool = False
    citations: CitationReport | None = None
    fallbacks: list[FallbackTaken] = Field(default_factory=list)
    state: RetrievalState | None = None
    # The application verifier's verdict: "accepted" or "needs-review" (null: none wired).
    verification: str | None = None


class RunRecord(_Response):
    """`GET /v1/runs/{id}`: the recorded run of the caller's subject. `status` is `running`,
    `completed` (with its `result`), `failed` (with its `error_code`) or `cancelled` (a newer
    host may add a status)."""

    run_id: str
    status: Annotated[RunStatus | str, known_values(RunStatus)]
    created_at: str
    result: RunResult | None = None
    error_code: str | None = None


class RunStartedEvent(_Response):
    type: Literal["run.started"] = "run.started"
    run_id: str
    created_at: str


class RunProgressEvent(_Response):
    """Progress always names its `phase`; the other fields are that phase's context."""

    type: Literal["run.progress"] = "run.progress"
    phase: Annotated[str, StringConstraints(min_length=1)]

    @property
    def context(self) -> dict[str, JsonValue]:
        """The phase's context: every field besides `type` and `phase`."""
        return dict(self.model_extra or {})


class RunDeltaEvent(_Response):
    type: Literal["run.delta"] = "run.delta"
    text: str


class RunCompletedEvent(_Response):
    type: Literal["run.completed"] = "run.completed"
    result: RunResult


class RunFailedEvent(_Response):
    type: Literal["run.failed"] = "run.failed"
    run_id: str | None = None
    problem: Problem


RunEvent = RunStartedEvent | RunProgressEvent | RunDeltaEvent | RunCompletedEvent | RunFailedEvent

"""Values of grounded runs: requests, events, results, receipts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import (
    EmbeddingUsage,
    JSONValue,
    Location,
    RerankUsage,
    SearchMode,
)

RetrievalMode: TypeAlias = Literal["off", "before", "tool"]
RETRIEVAL_MODES: Final = frozenset(("off", "before", "tool"))
ReceiptStatus: TypeAlias = Literal["ok", "failed", "duplicate", "quota-exceeded"]
ReceiptOutcome: TypeAlias = Literal[
    "evidence", "empty", "unavailable", "failed", "duplicate", "quota-exceeded"
]
# What a run does when an outcome happens (`Fallbacks`): fail with the outcome's error,
# continue without that evidence, or answer with a fixed reply (`FixedAnswer`).
FallbackAction: TypeAlias = Literal["fail", "continue"]
RunOutcome: TypeAlias = Literal[
    "no-evidence", "search-failed", "source-unavailable", "invalid-citation", "answer-rejected"
]
# How a model's answer ended: the model ended it (`stop`; also when it asked for tools), it
# was cut at the output-token limit (`length`), a content filter cut it (`content-filter`), or
# the provider named another reason (`other`). Probe G, session 42: a cut answer was recorded
# as a complete one, and nothing told them apart.
FinishReason: TypeAlias = Literal["stop", "length", "content-filter", "other"]


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
    # Each search's metadata filters (`SearchRequest.filters`, checked when the run starts).
    filters: Mapping[str, JSONValue] | None = None
    # Each search keeps only hits scoring at least this (`SearchRequest.min_score`, in its
    # mode's scale): a search left with none finds nothing, and a `before` run then fails
    # `NO_RETRIEVAL_EVIDENCE` instead of answering from whatever ranked first.
    min_score: float | None = None


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
class FixedAnswer:
    """Complete the run with this text instead (no further model call; it cites nothing)."""

    text: str


@dataclass(frozen=True, slots=True)
class Fallbacks:
    """What a run does per outcome; each defaults to what runs always did:

    - `no_evidence`: no authorized passage was found (`NO_RETRIEVAL_EVIDENCE`); `continue`
      generates (or completes) without evidence;
    - `search_failed`: no passage was found *and* a search of the run did not answer: its
      source or grant was not there (receipt outcome `unavailable`) or it failed (`failed`:
      the store, the embedding). None (the default) treats it as `no_evidence`, as runs always
      did; `fail` fails with that search's own error code; `continue` and an answer as usual;
    - `source_unavailable`: evidence was revoked before the result was recorded
      (`SOURCE_UNAVAILABLE`); `continue` records the result without the revoked passages;
    - `invalid_citation`: the host's citation check failed (`INVALID_CITATION`); `continue`
      completes with the answer as it is and the failure in its citation report;
    - `answer_rejected`: the application's verifier rejected the answer (`ANSWER_REJECTED`);
      `continue` completes with the answer and `verification: "rejected"`.
    """

    no_evidence: FallbackAction | FixedAnswer = "fail"
    source_unavailable: FallbackAction | FixedAnswer = "fail"
    invalid_citation: FallbackAction | FixedAnswer = "fail"
    search_failed: FallbackAction | FixedAnswer | None = None
    answer_rejected: FallbackAction | FixedAnswer = "fail"


@dataclass(frozen=True, slots=True)
class FallbackApplied:
    """A declared fallback the run took instead of failing."""

    outcome: RunOutcome
    action: Literal["continue", "answer"]


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
    # The check's failure, when the run continued past it (`Fallbacks.invalid_citation`).
    failure: str | None = None  # its `INVALID_CITATION` reason


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
    # What happens on each outcome (default: fail, as before).
    fallbacks: Fallbacks = Fallbacks()
    # Attempts per model call: a provider failure that may pass (`TransientError`: a rate
    # limit, a server error, a dropped connection) is asked again, with a backoff, while the
    # failed attempt had streamed nothing. 1: never (as before).
    max_attempts: int = 1


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One passage the run supplied to the model: what `[source:ID]` may cite."""

    id: str  # the chunk id
    source_id: str
    revision: str
    location: Location
    title: str = ""
    origin: Literal["retrieval"] = "retrieval"
    # The SHA-256 of the passage's text as the run read it (None in records made before it
    # was kept): a revision label may be written again with other text under the same ids.
    text_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class RawHit:
    """One hit of a search as it returned it: the passage and its (final) score."""

    chunk_id: str
    score: float


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
    # The query as the model or caller sent it (`query` is it normalized); None in receipts
    # recorded before receipts kept it.
    raw_query: str | None = None
    # The success sequence: 1, 2, 3 for successful searches only (None for other attempts).
    success: int | None = None
    # What the application's effects returned after this search, by effect name, and the one
    # that failed (name and error), which stopped the later ones.
    extensions: Mapping[str, JSONValue] = field(default_factory=dict)
    effect_error: Mapping[str, str] | None = None
    # The raw result: every hit the search returned, in its order, with its score (passages
    # already in the evidence or past the run's byte budget included); `source_ids` is what of
    # it joined the run. Empty for receipts recorded before receipts kept it.
    raw_hits: Sequence[RawHit] = field(default_factory=list)

    @property
    def outcome(self) -> ReceiptOutcome:
        """What the attempt came to: passages (`evidence`), none (`empty`), a source or grant
        that was not there (`unavailable`), another failure (`failed`), or not made."""
        if self.status == "ok":
            return "evidence" if self.source_ids else "empty"
        if self.status == "failed":
            unavailable = self.error_code in ("SOURCE_UNAVAILABLE", "PERMISSION_DENIED")
            return "unavailable" if unavailable else "failed"
        return self.status


@dataclass(frozen=True, slots=True)
class RetrievalState:
    """A run's retrieval state at its end: successful searches against the quota, the dedup
    keys it used (failed attempts keep theirs), and the sources of its evidence."""

    query_count: int
    max_queries: int
    seen: Sequence[str]
    sources: Sequence[str]


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
    # The namespace it was read in (None for a run without evidence, and in records made
    # before it was kept): a replay re-authorizes it there only.
    namespace: str | None = None
    replayed: bool = False
    # The host's citation check, when the request asked for one.
    citations: CitationReport | None = None
    # The declared fallbacks the run took, in order.
    fallbacks: Sequence[FallbackApplied] = ()
    # Its retrieval state (None for a run without retrieval, and in records made before).
    state: RetrievalState | None = None
    # The application verifier's verdict on a completed run: "accepted", "needs-review", or
    # "rejected" when the run's `answer_rejected` fallback continued past a rejection (None
    # when no verifier is wired, or the reply was a fixed fallback).
    verification: str | None = None
    # How the answer in `text` ended: the last model call's finish (a fixed fallback reply is
    # whole: `stop`). None in records written before runs kept it (unknown).
    finish_reason: FinishReason | None = None


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

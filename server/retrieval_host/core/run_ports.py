"""Ports of grounded runs: generation providers and the durable run record store."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import Hit, JSONValue, Location, SearchRequest, SearchResult
from retrieval_host.core.runs_model import FinishReason, GenerationUsage, Receipt, RunResult


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model produced it


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call_id: str | None = None
    tool_calls: Sequence[ToolCall] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, JSONValue]


@dataclass(frozen=True, slots=True)
class EvidencePassage:
    """A passage supplied to the model, structured for providers that do not read prompts."""

    handle: str  # the chunk id, cited as [source:handle]
    source_id: str
    revision: str
    title: str
    location: Location
    text: str
    # The namespace its search read it in: re-authorized against the caller's namespace too
    # (another namespace may hold a source of the same id at the same revision).
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    model: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    evidence: Sequence[EvidencePassage] = ()
    question: str = ""
    step: int = 1
    # The run's provider as the host names it (its key in `providers`) and the run: for what
    # an adapter logs about the call (a provider that reported no token usage).
    provider: str = ""
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallRequested:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class UsageReported:
    usage: GenerationUsage


@dataclass(frozen=True, slots=True)
class FinishReported:
    """How the model ended this call's answer (`core.runs_model.FinishReason`), after its text
    and tool calls. A call whose provider reports none ended `stop` (its stream ended whole);
    a tool call in an answer that ended `length` is cut off and fails the run."""

    reason: FinishReason


GenerationEvent: TypeAlias = TextDelta | ToolCallRequested | FinishReported | UsageReported


class GenerationProvider(Protocol):
    """A generation account. Streams events; raises `PROVIDER_FAILED` (never retries).

    Implementations call `cancel.check()` while streaming. Each non-empty event yielded counts
    as progress for an idle timeout (the engine marks it); a provider that receives chunks
    it yields nothing for (a model's reasoning, keep-alives with content) calls
    `cancel.progress()` on them itself, so an idle timeout counts real progress only.

    A call's events: its text (`TextDelta`) as it streams, then its tool calls, how the answer
    ended (`FinishReported`) and its token usage (`UsageReported`; zeros for a call that
    costs nothing: a call without it counts as a request of unknown tokens).

    A provider that serves a fixed set of models may name them in a `models` attribute (a set
    of strings): a run naming another is then refused before it starts (`INVALID_REQUEST`,
    reason `unknown-model`); without it, the model name is the vendor's to judge.
    """

    @property
    def kind(self) -> str: ...

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]: ...


RunStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    subject: str
    idempotency_key: str | None
    request_fingerprint: str
    status: RunStatus
    created_at: str
    result: RunResult | None = None
    error_code: str | None = None
    extra: Mapping[str, JSONValue] = field(default_factory=dict)
    # What running it needed: reading or replaying the record needs it again. None in records
    # written before they were kept (then only a result's own provider and corpus are known).
    provider: str | None = None
    corpus: str | None = None


class RunStore(Protocol):
    """Durable run records; idempotency keys are unique per subject."""

    def begin(self, record: RunRecord) -> RunRecord | None:
        """Insert a `running` record; if the subject already used its idempotency key, insert
        nothing and return the existing record."""
        ...

    def complete(self, run_id: str, result: RunResult) -> None: ...

    def finish(self, run_id: str, status: RunStatus, error_code: str) -> None: ...

    def get(self, run_id: str) -> RunRecord | None: ...


VerifierDecision: TypeAlias = Literal[
    "accept", "reject", "unavailable", "retryable", "needs-review"
]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's judgement of one answer."""

    decision: VerifierDecision


class Verifier(Protocol):
    """An application's own check of a run's answer against the evidence it was given, after
    the host's checks (citations, re-authorization) and before the result is recorded.

    `accept` completes the run; `needs-review` completes it marked `verification:
    "needs-review"` for a person to look at; `reject` fails it with `ANSWER_REJECTED`;
    `unavailable` and `retryable` fail it with `PROVIDER_FAILED` (reasons
    `verifier-unavailable`, `verifier-retryable`: a client may retry the latter). An exception
    from `verify` fails the run as `INTERNAL` (the host logs it). A fixed fallback reply is not
    verified (it is the application's own text)."""

    def verify(
        self, question: str, answer: str, evidence: Sequence[EvidencePassage]
    ) -> Verdict: ...


class ContextPolicy(Protocol):
    """An application's choice of what of a run's evidence reaches the model, before each
    model call: a selection from `evidence`, in the order the model should read it.

    The host keeps only passages of `evidence` (a policy cannot add text the grant did not
    authorize), and a run's manifest is what reached the model, so a passage the policy
    held back cannot be cited."""

    def select(
        self, question: str, evidence: Sequence[EvidencePassage]
    ) -> Sequence[EvidencePassage]: ...


class Retriever(Protocol):
    """An application's own search for a run's retrievals (`RunEngine(retriever=...)`), in
    place of the corpus's built-in search: an external engine, a rule, a cache.

    The run's lifecycle stays the host's (normalize, check input, dedup and quota, authorize,
    budgets, receipts). What the retriever returns is trusted for nothing but its order: each
    hit is read again from the corpus's store by chunk id under the caller's grant (a passage
    outside it, or of another revision, is dropped), and the stored text, location and
    revision are what the run uses."""

    def search(self, request: SearchRequest, context: RequestContext) -> SearchResult: ...


# The dedup key of a run's search: (corpus, source ids or None, normalized query) -> key. Two
# searches of one run with one key are one search (the second is a `duplicate`).
DedupKey: TypeAlias = Callable[[str, Sequence[str] | None, str], str]


class RetrievalEffect(Protocol):
    """An application effect after each successful search of a run (`RunEngine(effects=[...])`),
    run in order: a cache write, an audit line, a metric. What it returns is kept in the
    receipt's `extensions` under its `name`. An effect that raises stops the ones after it;
    the receipt says which failed and how (`effectError`), and the earlier effects are not
    undone (nothing pretends to roll back). The search's evidence stands either way."""

    name: str

    def after(self, receipt: Receipt, hits: Sequence[Hit]) -> JSONValue: ...

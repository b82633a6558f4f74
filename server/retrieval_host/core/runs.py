"""The run engine: grounded generation over authorized evidence, one deterministic path.

Every retrieval inside a run goes through `_retrieve`, in this order: prepare (normalize) →
check input → dedup and quota → authorize → reserve the dedup key → execute → check result →
count successes and sources → effects (progress, receipt). A failed attempt keeps its key and
is not retried.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import check_label
from retrieval_host.core.errors import (
    ErrorCode,
    RetrievalError,
    permission_denied,
    source_unavailable,
)
from retrieval_host.core.evidence import SYSTEM_INSTRUCTIONS, fence
from retrieval_host.core.models import EmbeddingUsage, JSONValue, SearchRequest
from retrieval_host.core.run_ports import (
    EvidencePassage,
    GenerationProvider,
    GenerationRequest,
    Message,
    RunRecord,
    RunStore,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    ToolSpec,
    UsageReported,
)
from retrieval_host.core.runs_model import (
    GenerationUsage,
    ManifestEntry,
    OutputArtifact,
    Receipt,
    ReceiptStatus,
    RunCompleted,
    RunDelta,
    RunEvent,
    RunFailed,
    RunProgress,
    RunRequest,
    RunResult,
    RunRetrieval,
    RunStarted,
    RunUsage,
)
from retrieval_host.core.service import RetrievalService, denied, utc_now

MAX_INPUT_BYTES = 65_536
MAX_GENERATION_STEPS = 16
SEARCH_TOOL = ToolSpec(
    name="search_context",
    description=(
        "Search the documents you are allowed to read. Returns passages with [source:ID] "
        "handles to cite."
    ),
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for."}},
        "required": ["query"],
        "additionalProperties": False,
    },
)

EventSink = Callable[[RunEvent], None]


def _new_run_id() -> str:
    return "run_" + secrets.token_hex(12)


def _new_delimiter() -> str:
    return "EVIDENCE-" + secrets.token_hex(16)


def request_fingerprint(request: RunRequest) -> str:
    """What makes two run requests 'the same' for an idempotency key (timeouts excluded)."""
    body = asdict(replace(request, idle_timeout_ms=None))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_run_request(request: RunRequest) -> None:
    check_label("provider", request.provider)
    check_label("model", request.model)
    if not request.input.strip() or len(request.input.encode("utf-8")) > MAX_INPUT_BYTES:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"input must be 1-{MAX_INPUT_BYTES} bytes of text."
        )
    if not 1 <= request.max_generation_steps <= MAX_GENERATION_STEPS:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"maxGenerationSteps must be in 1..{MAX_GENERATION_STEPS}."
        )
    if request.idle_timeout_ms is not None and request.idle_timeout_ms < 1:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "idleTimeoutMs must be positive.")
    if request.idempotency_key is not None and not 1 <= len(request.idempotency_key) <= 200:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "idempotencyKey must be 1-200 chars.")
    r = request.retrieval
    if r is not None and not 0 <= r.max_queries <= 16:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "maxQueries must be in 0..16.")


@dataclass
class _RunState:
    run_id: str
    created_at: str
    delimiter: str
    seen: set[str] = field(default_factory=set)
    successes: int = 0
    sequence: int = 0
    evidence: dict[str, EvidencePassage] = field(default_factory=dict)
    receipts: list[Receipt] = field(default_factory=list)
    generation: GenerationUsage = field(default_factory=GenerationUsage)
    embedding: EmbeddingUsage = field(default_factory=EmbeddingUsage)


class RunEngine:
    """Runs grounded generation. Synchronous: the caller runs it in a worker thread.

    Evidence is re-authorized before each generation step (revoked passages are dropped before
    the model sees them) and once more before the result is recorded (a revocation then fails
    the run). These are point-in-time checks: bytes already sent to a provider or streamed to a
    client cannot be retracted.
    """

    def __init__(
        self,
        retrieval: RetrievalService | None,
        providers: Mapping[str, GenerationProvider],
        store: RunStore,
        *,
        clock: Callable[[], str] = utc_now,
        new_run_id: Callable[[], str] = _new_run_id,
        new_delimiter: Callable[[], str] = _new_delimiter,
    ) -> None:
        self._retrieval = retrieval
        self._providers = dict(providers)
        self._store = store
        self._clock = clock
        self._new_run_id = new_run_id
        self._new_delimiter = new_delimiter

    @property
    def providers(self) -> Mapping[str, GenerationProvider]:
        return dict(self._providers)

    def close(self) -> None:
        """Close the run store and any provider that holds connections."""
        for closable in (self._store, *self._providers.values()):
            close = getattr(closable, "close", None)
            if callable(close):
                close()

    # --- public entry points ------------------------------------------------------------

    def run(self, request: RunRequest, context: RequestContext) -> RunResult:
        """Execute a run to its end; raises the run's error if it fails."""
        outcome: list[RunResult] = []
        failure: list[RetrievalError] = []

        def sink(event: RunEvent) -> None:
            if isinstance(event, RunCompleted):
                outcome.append(event.result)
            elif isinstance(event, RunFailed):
                failure.append(event.error)

        self.execute(request, context, sink)
        if failure:
            raise failure[0]
        return outcome[0]

    def get_run(
        self,
        run_id: str,
        context: RequestContext,
        *,
        permits: Callable[[RunRecord], bool] | None = None,
    ) -> RunRecord:
        """The recorded run of this subject, its evidence re-authorized.

        `permits` is the caller's credential check beyond its subject (the host passes its
        token's provider and search grants). A run of another subject, one `permits` refuses
        and one that does not exist all raise the same `SOURCE_UNAVAILABLE`.
        """
        record = self._store.get(run_id)
        if (
            record is None
            or record.subject != context.subject
            or (permits is not None and not permits(record))
        ):
            raise RetrievalError(ErrorCode.SOURCE_UNAVAILABLE, "No such run.")
        if record.result is not None:
            self._reauthorize_manifest(record.result, context)
        return record

    def execute(self, request: RunRequest, context: RequestContext, emit: EventSink) -> None:
        """Execute a run, sending every event to `emit`; ends with run.completed or run.failed.

        Validation errors before a run exists (unknown provider, bad input, a reused key)
        raise instead: there is no run to report them on.
        """
        _check_run_request(request)
        provider = self._providers.get(request.provider)
        if provider is None:
            raise denied()
        if request.retrieval is not None and request.retrieval.mode != "off":
            if self._retrieval is None:
                raise permission_denied()
            self._retrieval.corpus(request.retrieval.corpus)  # same denial for unknown corpora

        fingerprint = request_fingerprint(request)
        state = _RunState(self._new_run_id(), self._clock(), self._new_delimiter())
        existing = self._store.begin(
            RunRecord(
                run_id=state.run_id,
                subject=context.subject,
                idempotency_key=request.idempotency_key,
                request_fingerprint=fingerprint,
                status="running",
                created_at=state.created_at,
                provider=request.provider,
                corpus=(
                    request.retrieval.corpus
                    if request.retrieval is not None and request.retrieval.mode != "off"
                    else None
                ),
            )
        )
        if existing is not None:
            self._replay(existing, fingerprint, context, emit)
            return

        emit(RunStarted(state.run_id, state.created_at))
        try:
            result = self._run(request, provider, state, context, emit)
        except RetrievalError as error:
            cancelled = error.code is ErrorCode.CANCELLED
            self._store.finish(
                state.run_id, "cancelled" if cancelled else "failed", error.code.value
            )
            emit(RunFailed(state.run_id, error))
            return
        except Exception:
            self._store.finish(state.run_id, "failed", ErrorCode.INTERNAL.value)
            emit(RunFailed(state.run_id, RetrievalError(ErrorCode.INTERNAL, "Internal error.")))
            raise
        emit(RunCompleted(result))

    def stream(self, request: RunRequest, context: RequestContext) -> Iterator[RunEvent]:
        """The streaming variant for in-process callers: events as a list-backed iterator."""
        events: list[RunEvent] = []
        self.execute(request, context, events.append)
        yield from events

    # --- replay --------------------------------------------------------------------------

    def _replay(
        self, existing: RunRecord, fingerprint: str, context: RequestContext, emit: EventSink
    ) -> None:
        if existing.request_fingerprint != fingerprint:
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                "this idempotencyKey was used for a different run request.",
                reason="idempotency-key-reused",
            )
        if existing.status != "completed" or existing.result is None:
            raise RetrievalError(
                ErrorCode.CONTEXT_REPLAY_UNAVAILABLE,
                "the run with this idempotencyKey did not complete, so it has no complete "
                "evidence snapshot to replay; reconcile it and use a new key.",
            )
        self._reauthorize_manifest(existing.result, context)
        emit(RunStarted(existing.run_id, existing.created_at))
        emit(RunCompleted(replace(existing.result, replayed=True)))

    def _reauthorize_manifest(self, result: RunResult, context: RequestContext) -> None:
        if not result.sources:
            return
        if self._retrieval is None or result.corpus is None:
            raise source_unavailable()
        ids = sorted({e.source_id for e in result.sources})
        grant = self._retrieval.current_grant(result.corpus, ids, context)
        allowed = dict(grant.sources) if grant is not None else {}
        if any(allowed.get(e.source_id) != e.revision for e in result.sources):
            raise source_unavailable()

    # --- the run -------------------------------------------------------------------------

    def _run(
        self,
        request: RunRequest,
        provider: GenerationProvider,
        state: _RunState,
        context: RequestContext,
        emit: EventSink,
    ) -> RunResult:
        spec = request.retrieval
        mode = spec.mode if spec is not None else "off"
        if mode == "before" and spec is not None:
            self._retrieve(spec, spec.query or request.input, state, context, emit)
            if not state.evidence:
                raise RetrievalError(
                    ErrorCode.NO_RETRIEVAL_EVIDENCE,
                    "No authorized passage matched; nothing was generated.",
                )

        tools = [SEARCH_TOOL] if mode == "tool" else []
        text_parts: list[str] = []
        # Tool rounds so far: the model's message and each call's outcome (handles or a note).
        # They are rendered again at every step, so a passage revoked since it was found is
        # left out of what the model sees next.
        rounds: list[tuple[Message, list[tuple[str, str | list[str]]]]] = []
        for step in range(1, request.max_generation_steps + 1):
            context.cancel.check()
            if spec is not None and state.evidence:
                self._recheck_evidence(spec, state, context, emit, drop=True)
            step_messages = [
                Message("system", SYSTEM_INSTRUCTIONS),
                Message("user", self._user_prompt(request.input, state, fenced=mode == "before")),
            ]
            for assistant, outcomes in rounds:
                step_messages.append(assistant)
                step_messages += [
                    Message("tool", self._render_tool(outcome, state), tool_call_id=call_id)
                    for call_id, outcome in outcomes
                ]
            emit(RunProgress("generation", {"step": step, "provider": request.provider}))
            calls: list[ToolCall] = []
            step_text: list[str] = []
            for event in provider.generate(
                GenerationRequest(
                    model=request.model,
                    messages=step_messages,
                    tools=tools,
                    evidence=list(state.evidence.values()),
                    question=request.input,
                    step=step,
                ),
                context.cancel,
            ):
                context.cancel.check()
                if isinstance(event, TextDelta):
                    if event.text:
                        step_text.append(event.text)
                        emit(RunDelta(event.text))
                elif isinstance(event, ToolCallRequested):
                    calls.append(event.call)
                elif isinstance(event, UsageReported):
                    state.generation += event.usage
            state.generation += GenerationUsage(requests=1)
            text_parts.extend(step_text)
            if not calls or mode != "tool" or spec is None:
                break
            assistant = Message("assistant", "".join(step_text), tool_calls=calls)
            rounds.append(
                (assistant, [(c.id, self._tool_call(spec, c, state, context, emit)) for c in calls])
            )
            if step == request.max_generation_steps:
                # The budget is the client's own limit (`maxGenerationSteps`): a 4xx, as an
                # expired `idleTimeoutMs` is, not a provider failure.
                raise RetrievalError(
                    ErrorCode.INVALID_REQUEST,
                    "The model still asked for tools when the run's maxGenerationSteps were spent.",
                    reason="step-budget-exhausted",
                )

        if mode == "tool" and not state.evidence:
            raise RetrievalError(
                ErrorCode.NO_RETRIEVAL_EVIDENCE, "The run found no authorized passage."
            )
        text = "".join(text_parts)
        emit(RunProgress("recording", {"sources": len(state.evidence)}))
        if spec is not None and state.evidence:
            self._recheck_evidence(spec, state, context, emit, drop=False)
        manifest = [
            ManifestEntry(p.handle, p.source_id, p.revision, p.location, p.title)
            for p in state.evidence.values()
        ]
        artifact = None
        if request.output_artifact is not None:
            cited = [m for m in _cited_ids(text) if m in state.evidence]
            artifact = OutputArtifact(
                request.output_artifact.name,
                request.output_artifact.media_type,
                cited or list(state.evidence),
            )
        result = RunResult(
            run_id=state.run_id,
            status="completed",
            provider=request.provider,
            model=request.model,
            text=text,
            sources=manifest,
            receipts=list(state.receipts),
            usage=RunUsage(state.generation, state.embedding),
            created_at=state.created_at,
            completed_at=self._clock(),
            artifact=artifact,
            corpus=spec.corpus if spec is not None and manifest else None,
        )
        self._store.complete(state.run_id, result)
        return result

    def _user_prompt(self, question: str, state: _RunState, *, fenced: bool) -> str:
        if not fenced or not state.evidence:
            return f"Question:\n{question}"
        return f"Question:\n{question}\n\n{fence(list(state.evidence.values()), state.delimiter)}"

    def _render_tool(self, outcome: str | list[str], state: _RunState) -> str:
        if isinstance(outcome, str):
            return outcome
        passages = [state.evidence[h] for h in outcome if h in state.evidence]
        return fence(passages, state.delimiter) if passages else "No passages matched."

    def _recheck_evidence(
        self,
        spec: RunRetrieval,
        state: _RunState,
        context: RequestContext,
        emit: EventSink,
        *,
        drop: bool,
    ) -> None:
        assert self._retrieval is not None
        emit(RunProgress("retrieval.authorization", {"check": "evidence", "corpus": spec.corpus}))
        ids = sorted({p.source_id for p in state.evidence.values()})
        grant = self._retrieval.current_grant(spec.corpus, ids, context)
        allowed = dict(grant.sources) if grant is not None else {}
        revoked = [h for h, p in state.evidence.items() if allowed.get(p.source_id) != p.revision]
        if revoked and not drop:
            raise source_unavailable()
        for handle in revoked:
            del state.evidence[handle]

    def _tool_call(
        self,
        spec: RunRetrieval,
        call: ToolCall,
        state: _RunState,
        context: RequestContext,
        emit: EventSink,
    ) -> str | list[str]:
        """One tool call: the handles it found (rendered per step), or a note for the model."""
        if call.name != SEARCH_TOOL.name:
            return "Unknown tool. Only search_context is available."
        try:
            arguments = json.loads(call.arguments)
            query = arguments["query"] if isinstance(arguments, dict) else None
        except (ValueError, KeyError):
            query = None
        if not isinstance(query, str):
            query = ""
        receipt = self._retrieve(spec, query, state, context, emit)
        if receipt.status == "ok":
            return list(receipt.source_ids)
        return {
            "duplicate": "This query was already searched in this run.",
            "quota-exceeded": "The search quota of this run is used up.",
        }.get(receipt.status, "The search failed.")

    def _retrieve(
        self,
        spec: RunRetrieval,
        raw_query: str,
        state: _RunState,
        context: RequestContext,
        emit: EventSink,
    ) -> Receipt:
        assert self._retrieval is not None
        started = self._clock()
        # prepare
        query = " ".join(raw_query.split())
        key = hashlib.sha256(
            json.dumps(
                [spec.corpus, sorted(spec.source_ids or []), query.casefold()],
                separators=(",", ":"),
            ).encode("utf-8")
        ).hexdigest()[:24]
        state.sequence += 1

        def receipt(
            status: ReceiptStatus, ids: Sequence[str] = (), code: str | None = None
        ) -> Receipt:
            r = Receipt(state.sequence, query, key, started, status, list(ids), code)
            state.receipts.append(r)
            emit(
                RunProgress(
                    "retrieval.receipt",
                    {"sequence": r.sequence, "status": status, "sources": len(ids)},
                )
            )
            return r

        # check input
        if not query or len(query.encode("utf-8")) > 8192:
            return receipt("failed", code=ErrorCode.INVALID_REQUEST.value)
        # dedup and quota
        if key in state.seen:
            return receipt("duplicate")
        if state.successes >= spec.max_queries:
            return receipt("quota-exceeded")
        # authorize (the service checks again, point-in-time, around its read)
        emit(RunProgress("retrieval.authorization", {"check": "query", "corpus": spec.corpus}))
        if self._retrieval.current_grant(spec.corpus, spec.source_ids, context) is None:
            state.seen.add(key)
            return receipt("failed", code=ErrorCode.PERMISSION_DENIED.value)
        # reserve the key: a failed attempt keeps it and is not retried
        state.seen.add(key)

        def forward(phase: str, details: Mapping[str, JSONValue]) -> None:
            emit(RunProgress(phase, dict(details)))

        scoped = RequestContext(context.subject, context.cancel, context.request_id, forward)
        try:
            result = self._retrieval.search_context(
                SearchRequest(
                    corpus=spec.corpus,
                    query=query,
                    source_ids=spec.source_ids,
                    limit=spec.limit,
                    max_context_bytes=spec.max_context_bytes,
                ),
                scoped,
            )
        except RetrievalError as error:
            if error.code in (ErrorCode.CANCELLED, ErrorCode.TIMEOUT):
                raise
            return receipt("failed", code=error.code.value)
        state.embedding += result.usage
        # check result: one passage once, and only passages of the requested corpus
        new = [h for h in result.hits if h.chunk_id not in state.evidence]
        for hit in new:
            if hit.scope.corpus != spec.corpus:  # pragma: no cover - the service guarantees it
                raise RetrievalError(ErrorCode.INTERNAL, "Internal error.")
        # count successes and sources
        state.successes += 1
        for hit in new:
            state.evidence[hit.chunk_id] = EvidencePassage(
                hit.chunk_id, hit.source.id, hit.source.revision, "", hit.location, hit.text
            )
        # effects
        return receipt("ok", [h.chunk_id for h in result.hits])


def _cited_ids(text: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"\[source:([^\[\]\s]+)\]", text)))

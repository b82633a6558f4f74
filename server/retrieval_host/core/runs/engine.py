"""`RunEngine`: the entry points of a run and its main loop; the steps live beside it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import (
    ErrorCode,
    RetrievalError,
    permission_denied,
    source_unavailable,
)
from retrieval_host.core.grants import denied
from retrieval_host.core.lifecycle import check_effect_names
from retrieval_host.core.reasons import ProviderFailedReason
from retrieval_host.core.run_ports import (
    ContextPolicy,
    DedupKey,
    GenerationProvider,
    RetrievalEffect,
    Retriever,
    RunRecord,
    RunStore,
    Verifier,
)
from retrieval_host.core.runs.citations import MARKERS_ONLY, check_citations
from retrieval_host.core.runs.evidence import reauthorize_manifest, recheck_evidence
from retrieval_host.core.runs.generation import (
    ToolRound,
    generate_step,
    step_budget_exhausted,
    token_budget_exhausted,
    unoffered_tool_call,
)
from retrieval_host.core.runs.replay import replay
from retrieval_host.core.runs.request import (
    check_model,
    check_run_request,
    request_fingerprint,
)
from retrieval_host.core.runs.result import build_result
from retrieval_host.core.runs.retrieval import SEARCH_TOOL, answer_tool_calls, retrieve
from retrieval_host.core.runs.state import (
    ActiveRun,
    EventSink,
    default_dedup_key,
    new_delimiter,
    new_run_id,
)
from retrieval_host.core.runs_model import (
    CitationReport,
    FallbackAction,
    FallbackApplied,
    Fallbacks,
    FinishReason,
    FixedAnswer,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunOutcome,
    RunProgress,
    RunRequest,
    RunResult,
    RunStarted,
    RunUsage,
)
from retrieval_host.core.service import RetrievalService, utc_now
from retrieval_host.core.usage import UsageSink, run_records


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
        new_run_id: Callable[[], str] = new_run_id,
        new_delimiter: Callable[[], str] = new_delimiter,
        verifier: Verifier | None = None,
        context_policy: ContextPolicy | None = None,
        retriever: Retriever | None = None,
        effects: Sequence[RetrievalEffect] = (),
        dedup_key: DedupKey = default_dedup_key,
        usage: UsageSink | None = None,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self._retrieval = retrieval
        self._retry_backoff_s = retry_backoff_s
        self._usage = usage
        self._verifier = verifier
        self._context_policy = context_policy
        self._retriever = retriever
        check_effect_names(effect.name for effect in effects)  # kept by name in receipts
        self._effects = tuple(effects)
        self._dedup_key = dedup_key
        self._providers = dict(providers)
        self._store = store
        self._clock = clock
        self._new_run_id = new_run_id
        self._new_delimiter = new_delimiter

    @property
    def usage(self) -> UsageSink | None:
        """Where completed runs' usage records go (None: not recorded)."""
        return self._usage

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
        token's provider and search grants). A run of another subject, one `permits` refuses,
        one whose evidence this subject may no longer read (or whose sources changed) and one
        that does not exist all raise the same `SOURCE_UNAVAILABLE`, word for word: the
        evidence check's own detail told the owner that the run existed (probe S, session 41).
        """
        no_such_run = RetrievalError(ErrorCode.SOURCE_UNAVAILABLE, "No such run.")
        record = self._store.get(run_id)
        if (
            record is None
            or record.subject != context.subject
            or (permits is not None and not permits(record))
        ):
            raise no_such_run
        if record.result is not None:
            try:
                reauthorize_manifest(self._retrieval, record.result, context)
            except RetrievalError as exc:
                if exc.code is not ErrorCode.SOURCE_UNAVAILABLE:
                    raise
                raise no_such_run from None
        return record

    def execute(self, request: RunRequest, context: RequestContext, emit: EventSink) -> None:
        """Execute a run, sending every event to `emit`; ends with run.completed or run.failed.

        Validation errors before a run exists (unknown provider, bad input, a reused key)
        raise instead: there is no run to report them on.
        """
        check_run_request(request)
        provider = self._providers.get(request.provider)
        if provider is None:
            raise denied()
        check_model(provider, request)
        spec = request.retrieval
        retrieval = spec if spec is not None and spec.mode != "off" else None
        if retrieval is not None:
            if self._retrieval is None:
                raise permission_denied()
            self._retrieval.corpus(retrieval.corpus)  # same denial for unknown corpora

        fingerprint = request_fingerprint(request)
        run = ActiveRun(
            self._new_run_id(),
            self._clock(),
            self._new_delimiter(),
            context,
            emit,
            self._clock,
            self._retrieval,
            max_tokens=request.max_tokens,
            context_policy=self._context_policy,
            retriever=self._retriever,
            dedup_key=self._dedup_key,
            effects=self._effects,
        )
        existing = self._store.begin(
            RunRecord(
                run_id=run.run_id,
                subject=context.subject,
                idempotency_key=request.idempotency_key,
                request_fingerprint=fingerprint,
                status="running",
                created_at=run.created_at,
                provider=request.provider,
                corpus=retrieval.corpus if retrieval is not None else None,
            )
        )
        if existing is not None:
            replay(existing, fingerprint, self._retrieval, context, emit)
            return

        try:
            emit(RunStarted(run.run_id, run.created_at))
            result = self._run(request, provider, run)
        except RetrievalError as error:
            cancelled = error.code is ErrorCode.CANCELLED
            try:
                self._store.finish(
                    run.run_id, "cancelled" if cancelled else "failed", error.code.value
                )
            except RetrievalError as unrecorded:
                # The store failed too (it was what failed the run, often): the caller learns
                # that its run's end is not recorded, a typed STORE_UNAVAILABLE, not a 500.
                error = unrecorded
            # What it spent before it failed was spent (a provider bills a cut-off stream).
            self._meter(request, provider, run, self._clock())
            emit(RunFailed(run.run_id, error))
            return
        except Exception:
            with contextlib.suppress(RetrievalError):  # the bug is what the log must show
                self._store.finish(run.run_id, "failed", ErrorCode.INTERNAL.value)
            self._meter(request, provider, run, self._clock())
            emit(RunFailed(run.run_id, RetrievalError(ErrorCode.INTERNAL, "Internal error.")))
            raise
        except BaseException:
            # Interrupted from outside (KeyboardInterrupt, SystemExit): its end is recorded, so
            # the record neither stays running nor keeps its lease renewed.
            with contextlib.suppress(RetrievalError):
                self._store.finish(run.run_id, "failed", ErrorCode.INTERNAL.value)
            raise
        emit(RunCompleted(result))

    def stream(self, request: RunRequest, context: RequestContext) -> Iterator[RunEvent]:
        """The streaming variant for in-process callers: events as a list-backed iterator."""
        events: list[RunEvent] = []
        self.execute(request, context, events.append)
        yield from events

    # --- the run -------------------------------------------------------------------------

    def _run(self, request: RunRequest, provider: GenerationProvider, run: ActiveRun) -> RunResult:
        """Retrieve first (mode `before`), generate step by step answering the model's searches
        (mode `tool`), re-authorize the evidence, check the citations when asked, record the
        result. An outcome with a declared fallback (`RunRequest.fallbacks`) continues or
        answers with its fixed reply instead of failing."""
        spec = request.retrieval
        mode = spec.mode if spec is not None else "off"
        fallbacks = request.fallbacks
        taken: list[FallbackApplied] = []
        fixed: str | None = None
        if mode == "before" and spec is not None:
            retrieve(run, spec, spec.query or request.input)
            if not run.evidence:
                fixed = _without_evidence(run, taken, fallbacks, _no_evidence_before())

        tools = [SEARCH_TOOL] if mode == "tool" else []
        text: list[str] = []
        # How the last model call ended: the answer's end (tool mode: the final answer's).
        finish: FinishReason = "stop"
        rounds: list[ToolRound] = []
        for step in range(1, request.max_generation_steps + 1):
            if fixed is not None:
                break
            run.context.cancel.check()
            if request.max_tokens is not None and run.tokens_spent >= request.max_tokens:
                raise token_budget_exhausted(run.tokens_spent, request.max_tokens)
            if spec is not None and run.evidence:
                found = set(run.evidence)
                recheck_evidence(run, spec, drop=True)
                dropped = found - set(run.evidence)
                if dropped:
                    # Revoked since it was found (a new revision of its source, a grant
                    # taken back): the run's `sourceUnavailable` decides, as at recording. It
                    # was dropped silently, and a `before` run left with nothing called the
                    # model without evidence and completed (a black-box test, ~1% of runs
                    # racing re-ingests).
                    action = fallbacks.source_unavailable
                    if action == "continue" and dropped & run.shown:
                        # The model read it at an earlier step: what it writes next may draw
                        # on it (its own messages are sent again), as at recording.
                        raise source_unavailable()
                    noted = any(t.outcome == "source-unavailable" for t in taken)
                    if not (action == "continue" and noted):  # listed once per run
                        fixed = _fallback(
                            run, taken, "source-unavailable", action, source_unavailable()
                        )
                    if fixed is None and mode == "before" and not run.evidence:
                        fixed = _without_evidence(run, taken, fallbacks, _no_evidence_before())
                    if fixed is not None:
                        break
            output = generate_step(
                provider,
                request,
                run,
                step=step,
                rounds=rounds,
                tools=tools,
                fenced=mode == "before",
                backoff_s=self._retry_backoff_s,
            )
            text.append(output.text)
            finish = output.finish_reason
            if output.calls and (mode != "tool" or spec is None):
                # No tool was offered: the answer is not all there (often it is nothing but
                # the call), and recording it as completed would pass it off as one.
                raise unoffered_tool_call()
            if not output.calls or spec is None:
                break
            rounds.append(answer_tool_calls(run, spec, output))
            if step == request.max_generation_steps:
                if run.evidence:
                    raise step_budget_exhausted()
                break  # still searching and nothing found: no evidence (below), not the budget

        if fixed is None and mode == "tool" and not run.evidence:
            fixed = _without_evidence(run, taken, fallbacks, _no_evidence_tool())
        run.emit(RunProgress("recording", {"sources": len(run.evidence)}))
        if spec is not None and run.evidence:
            try:
                recheck_evidence(run, spec, drop=False)
            except RetrievalError as error:
                if error.code is not ErrorCode.SOURCE_UNAVAILABLE:
                    raise
                shown, held = run.cited_evidence(), set(run.evidence)
                recheck_evidence(run, spec, drop=True)  # recorded without the revoked ones
                action = fallbacks.source_unavailable
                if action == "continue" and any(h in shown for h in held - set(run.evidence)):
                    # The answer was written from a passage revoked since: nothing is left to
                    # go on with (no step follows), and recording it would keep serving the
                    # revoked text. A fixed reply still replaces it.
                    raise error
                replied = _fallback(run, taken, "source-unavailable", action, error)
                fixed = replied if replied is not None else fixed
        answer = fixed if fixed is not None else "".join(text)
        if fixed is not None:
            finish = "stop"  # a fixed reply is whole, whatever the model's answer was
        report = None
        if fixed is None:
            # Every completed answer's markers name passages of its manifest (issue 5; a model
            # inventing a handle completed unless the caller asked for the check): without
            # `citations`, the check of markers alone, and no report.
            asked = request.citations is not None
            if asked:
                run.emit(RunProgress("citations", {"sources": len(run.evidence)}))
            try:
                checked = check_citations(
                    answer, run.cited_evidence(), request.citations or MARKERS_ONLY
                )
                report = checked if asked else None
            except RetrievalError as error:
                replied = _fallback(
                    run, taken, "invalid-citation", fallbacks.invalid_citation, error
                )
                if replied is not None:
                    answer, finish = replied, "stop"
                else:
                    report = CitationReport([], failure=error.reason)
        verification = None
        if self._verifier is not None and fixed is None:
            try:
                verification = _verify(self._verifier, request, run, answer)
            except RetrievalError as error:
                if error.code is not ErrorCode.ANSWER_REJECTED:
                    raise
                replied = _fallback(run, taken, "answer-rejected", fallbacks.answer_rejected, error)
                if replied is None:
                    verification = "rejected"  # completed as it is, the verdict on record
                else:
                    answer, report = replied, None  # a fixed reply cites nothing
                    finish = "stop"
        result = replace(
            build_result(request, run, answer, report, taken),
            verification=verification,
            finish_reason=finish,
        )
        self._store.complete(run.run_id, result)
        self._meter(request, provider, run, result.completed_at or result.created_at)
        return result

    def _meter(
        self, request: RunRequest, provider: GenerationProvider, run: ActiveRun, at: str
    ) -> None:
        """The run's usage records as of `at`, to the sink: what a completed run spent, or a
        failed or cancelled one before it ended (a replay never gets here)."""
        if self._usage is None:
            return
        spec = request.retrieval
        corpus = (
            self._retrieval.corpora.get(spec.corpus)
            if spec is not None and self._retrieval is not None
            else None
        )
        records = run_records(
            at,
            run.context.subject,
            run.run_id,
            request.provider,
            getattr(provider, "account_id", None),
            request.model,
            RunUsage(run.generation, run.embedding, run.rerank),
            None if corpus is None else corpus.id,
            None if corpus is None else corpus.embedding.descriptor,
            None if corpus is None or corpus.reranker is None else corpus.reranker.descriptor,
        )
        if records:
            self._usage.record_usage(records)


def _fallback(
    run: ActiveRun,
    taken: list[FallbackApplied],
    outcome: RunOutcome,
    action: FallbackAction | FixedAnswer,
    error: RetrievalError,
) -> str | None:
    """Apply the run's declared fallback for `outcome`: raise `error` (`fail`), or note it,
    report it as an `outcome` progress event and return the fixed reply (None to continue)."""
    if action == "fail":
        raise error
    answered = isinstance(action, FixedAnswer)
    if answered:
        # A fixed reply cites nothing: its manifest is empty, so its record and replay do not
        # depend on passages it never used (a re-ingest of one made them 404: a black-box test).
        run.evidence.clear()
    applied = FallbackApplied(outcome, "answer" if answered else "continue")
    taken.append(applied)
    run.emit(RunProgress("outcome", {"outcome": outcome, "action": applied.action}))
    return action.text if isinstance(action, FixedAnswer) else None


def _without_evidence(
    run: ActiveRun, taken: list[FallbackApplied], fallbacks: Fallbacks, error: RetrievalError
) -> str | None:
    """The fallback of a run that found no passage: `search_failed` when one of its searches
    did not answer and the run declared it, else `no_evidence` (`error`)."""
    cut = next((r for r in run.receipts if r.status == "quota-exceeded" and r.raw_hits), None)
    if cut is not None:
        # Its searches matched, the caller's byte budget left every passage out: no fallback
        # for "the documents do not cover it" applies (they may), so the run fails saying so.
        raise RetrievalError(
            ErrorCode.NO_RETRIEVAL_EVIDENCE,
            f"Search {cut.sequence} of the run matched {len(cut.raw_hits)} authorized "
            "passage(s), but none fits the run's byte budget (maxContextBytes); the run has "
            "no evidence to answer from.",
        )
    if run.held_back is not None:
        # A budget kept a search from being made (`maxRerankCalls: 0` on a reranking corpus
        # answered "The documents do not cover this." without searching them: probe H,
        # session 40): like the byte budget above, no `noEvidence` reply applies.
        sequence, budget = run.held_back
        raise RetrievalError(
            ErrorCode.NO_RETRIEVAL_EVIDENCE,
            f"Search {sequence} of the run was not made: the run's {budget} was spent; "
            "the run has no evidence to answer from.",
        )
    failed = next((r for r in run.receipts if r.outcome in ("unavailable", "failed")), None)
    if failed is None:
        return _fallback(run, taken, "no-evidence", fallbacks.no_evidence, error)
    code = ErrorCode(failed.error_code or ErrorCode.INTERNAL.value)
    if fallbacks.search_failed is None:
        # Handled as no evidence, as runs always were; the detail says a search failed (a
        # broken reranker read "No authorized passage matched", like an empty corpus).
        said = RetrievalError(
            error.code,
            f"{error.detail} Search {failed.sequence} of the run did not answer ({code.value}).",
            reason=error.reason,
        )
        return _fallback(run, taken, "no-evidence", fallbacks.no_evidence, said)
    search_error = RetrievalError(
        code, f"Search {failed.sequence} of the run did not answer ({code.value}); no passage."
    )
    return _fallback(run, taken, "search-failed", fallbacks.search_failed, search_error)


def _no_evidence_before() -> RetrievalError:
    return RetrievalError(
        ErrorCode.NO_RETRIEVAL_EVIDENCE, "No authorized passage matched; nothing was generated."
    )


def _no_evidence_tool() -> RetrievalError:
    return RetrievalError(ErrorCode.NO_RETRIEVAL_EVIDENCE, "The run found no authorized passage.")


def _verify(verifier: Verifier, request: RunRequest, run: ActiveRun, answer: str) -> str:
    """The application verifier's verdict, as the result's `verification` or the run's error
    (see `core.run_ports.Verifier`)."""
    run.emit(RunProgress("verification", {"sources": len(run.evidence)}))
    decision = verifier.verify(request.input, answer, list(run.evidence.values())).decision
    if decision == "accept":
        return "accepted"
    if decision == "needs-review":
        return "needs-review"
    if decision == "reject":
        raise RetrievalError(
            ErrorCode.ANSWER_REJECTED, "The application's verifier rejected the answer."
        )
    if decision == "retryable":
        raise RetrievalError(
            ErrorCode.PROVIDER_FAILED,
            "The application's verifier could not judge the answer; retrying may succeed.",
            reason=ProviderFailedReason.VERIFIER_RETRYABLE,
        )
    raise RetrievalError(
        ErrorCode.PROVIDER_FAILED,
        "The application's verifier could not judge the answer.",
        reason=ProviderFailedReason.VERIFIER_UNAVAILABLE,
    )

"""One generation step: the messages of the step, the provider's stream, what it asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from retrieval_host.core.errors import ErrorCode, RetrievalError, TransientError
from retrieval_host.core.evidence import SYSTEM_INSTRUCTIONS
from retrieval_host.core.reasons import InvalidRequestReason, ProviderFailedReason
from retrieval_host.core.run_ports import (
    FinishReported,
    GenerationProvider,
    GenerationRequest,
    Message,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    ToolSpec,
    UsageReported,
)
from retrieval_host.core.runs.evidence import render_tool, user_prompt
from retrieval_host.core.runs.state import ActiveRun
from retrieval_host.core.runs_model import (
    FinishReason,
    GenerationUsage,
    RunDelta,
    RunProgress,
    RunRequest,
)

# A tool round: the model's message, and per call its id and outcome (the handles it found,
# or a note for the model).
ToolRound: TypeAlias = tuple[Message, list[tuple[str, str | list[str]]]]

# The longest wait between two attempts of one model call.
MAX_BACKOFF_S: Final = 8.0
# The most text the host takes from one model call. `maxOutputTokens` is only a request to
# the provider: a server that ignores it (a looping model, a broken proxy) streamed 200 MB
# into one run, all of it buffered for the client, recorded and checked (a black-box test).
# 1 MiB of characters is several times the longest answer of any current model. Each streamed
# piece also counts `DELTA_OVERHEAD` (what its event costs to queue for a client that reads
# slowly, beyond its text): a model streaming one character at a time stops at ~116,000.
MAX_ANSWER_CHARS: Final = 1 << 20
DELTA_OVERHEAD: Final = 8


@dataclass(frozen=True)
class StepOutput:
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    # How the model ended this answer (`stop` when its provider did not say).
    finish_reason: FinishReason = "stop"


def generate_step(
    provider: GenerationProvider,
    request: RunRequest,
    run: ActiveRun,
    *,
    step: int,
    rounds: Sequence[ToolRound],
    tools: Sequence[ToolSpec],
    fenced: bool,
    backoff_s: float = 0.5,
) -> StepOutput:
    """Ask the provider, streaming its text as `run.delta` events; ask again (up to the
    request's `max_attempts`, waiting `backoff_s`, doubling, at most `MAX_BACKOFF_S`; at least
    the service's `Retry-After`, and no retry when that asks for longer) after a
    `TransientError` before anything of the answer streamed. A tool call in an answer that
    ended `length` fails the step (`answer-truncated`): its arguments are cut off.

    The tool rounds so far are rendered again at every step, so a passage revoked since it
    was found is left out of what the model sees next.
    """
    visible = run.visible(request.input)
    by_handle = {p.handle: p for p in visible}
    messages = [
        Message("system", SYSTEM_INSTRUCTIONS),
        Message("user", user_prompt(request.input, visible, run.delimiter, fenced=fenced)),
    ]
    for assistant, outcomes in rounds:
        messages.append(assistant)
        messages += [
            Message("tool", render_tool(outcome, by_handle, run.delimiter), tool_call_id=call_id)
            for call_id, outcome in outcomes
        ]
    run.emit(RunProgress("generation", {"step": step, "provider": request.provider}))
    asked = GenerationRequest(
        model=request.model,
        messages=messages,
        tools=tools,
        evidence=visible,
        question=request.input,
        step=step,
        provider=request.provider,
        run_id=run.run_id,
    )
    for attempt in range(1, request.max_attempts + 1):
        calls: list[ToolCall] = []
        text: list[str] = []
        size = 0
        finish: FinishReason = "stop"
        try:
            for event in provider.generate(asked, run.context.cancel):
                run.context.cancel.check()
                if not isinstance(event, TextDelta) or event.text:
                    # What the provider delivered is progress, whether or not its adapter said
                    # so (a plug-in streaming text every 0.3 s was idle to a 1 s timeout); an
                    # empty delta is a keep-alive, and heartbeats are not progress.
                    run.context.cancel.progress()
                if isinstance(event, TextDelta):
                    if event.text:
                        size += len(event.text) + DELTA_OVERHEAD
                        if size > MAX_ANSWER_CHARS:
                            raise answer_too_large()
                        text.append(event.text)
                        run.emit(RunDelta(event.text))
                elif isinstance(event, ToolCallRequested):
                    calls.append(event.call)
                elif isinstance(event, UsageReported):
                    run.generation += event.usage
                elif isinstance(event, FinishReported):
                    finish = event.reason
        except RetrievalError as error:
            transient = isinstance(error, TransientError)
            # The failed attempt was a request, whatever ended it (a cancel, a broken stream):
            # a provider bills what it answered. Its tokens are unknown (they come last).
            run.generation += GenerationUsage(requests=1)
            # A run cancelled meanwhile (a disconnect, the host's shutdown) ends as cancelled,
            # whatever the provider's cut-off call looked like to its adapter.
            run.context.cancel.check()
            if not transient:
                raise
            if text or calls or attempt == request.max_attempts:
                raise  # streamed bytes cannot be taken back; or no attempt is left
            delay = min(backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
            wanted = error.retry_after_s if isinstance(error, TransientError) else None
            if wanted is not None:
                if wanted > MAX_BACKOFF_S:
                    raise  # longer than a run waits: the caller decides when to try again
                delay = max(delay, wanted)  # the service's own word, within the host's bound
            run.emit(
                RunProgress(
                    "generation.retry",
                    {"step": step, "attempt": attempt + 1, "reason": error.reason, "wait": delay},
                )
            )
            run.context.cancel.wait(delay)
            continue
        run.generation += GenerationUsage(requests=1)
        if calls and finish == "length":
            raise answer_truncated()
        return StepOutput("".join(text), calls, finish)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def answer_too_large() -> RetrievalError:
    return RetrievalError(
        ErrorCode.PROVIDER_FAILED,
        f"The model's answer passed the host's bound of {MAX_ANSWER_CHARS:,} characters per "
        "call (the provider did not stop at maxOutputTokens).",
        reason=ProviderFailedReason.ANSWER_TOO_LARGE,
    )


def answer_truncated() -> RetrievalError:
    """A tool call in an answer cut at the output-token limit: its arguments are incomplete.
    Searching with them failed, and the run ended `NO_RETRIEVAL_EVIDENCE` as if the corpus
    had nothing (probe G, session 42)."""
    return RetrievalError(
        ErrorCode.PROVIDER_FAILED,
        "The model's answer was cut off at its output-token limit (maxOutputTokens or the "
        "model's own) in the middle of a tool call.",
        reason=ProviderFailedReason.ANSWER_TRUNCATED,
    )


def unoffered_tool_call() -> RetrievalError:
    """The model asked for a tool although the run offered none (mode `before`, or no
    retrieval): a provider that does not follow the request, not an answer."""
    return RetrievalError(
        ErrorCode.PROVIDER_FAILED,
        "The model asked for a tool the run did not offer, instead of answering.",
        reason=ProviderFailedReason.UNOFFERED_TOOL_CALL,
    )


def step_budget_exhausted() -> RetrievalError:
    # The budget is the client's own limit (`maxGenerationSteps`): a 4xx, as an expired
    # `idleTimeoutMs` is, not a provider failure.
    return RetrievalError(
        ErrorCode.INVALID_REQUEST,
        "The model still asked for tools when the run's maxGenerationSteps were spent.",
        reason=InvalidRequestReason.STEP_BUDGET_EXHAUSTED,
    )


def token_budget_exhausted(spent: int, budget: int) -> RetrievalError:
    """The run's `maxTokens` were spent before a model call it still needed: the client's
    own limit, a 4xx like `maxGenerationSteps`."""
    return RetrievalError(
        ErrorCode.INVALID_REQUEST,
        f"The run had spent {spent} of its maxTokens {budget} before its next model call.",
        reason=InvalidRequestReason.TOKEN_BUDGET_EXHAUSTED,
    )

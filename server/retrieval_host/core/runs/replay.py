"""A reused idempotency key: the recorded result again, if the request and the evidence allow."""

from __future__ import annotations

from dataclasses import replace

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import ContextReplayUnavailableReason, InvalidRequestReason
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs.evidence import reauthorize_manifest
from retrieval_host.core.runs.state import EventSink
from retrieval_host.core.runs_model import RunCompleted, RunDelta, RunStarted
from retrieval_host.core.service import RetrievalService


def replay(
    existing: RunRecord,
    fingerprint: str,
    retrieval: RetrievalService | None,
    context: RequestContext,
    emit: EventSink,
) -> None:
    """Emit the recorded run (marked `replayed`; its text as one `RunDelta`, so that a reader
    that shows the deltas shows the answer, a black-box test), or raise: `INVALID_REQUEST`
    for a key used with another request, `CONTEXT_REPLAY_UNAVAILABLE` for a run that did not
    complete, `SOURCE_UNAVAILABLE` for evidence no longer readable."""
    if existing.request_fingerprint != fingerprint:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "this idempotencyKey was used for a different run request.",
            reason=InvalidRequestReason.IDEMPOTENCY_KEY_REUSED,
        )
    if existing.status == "running":
        # Running still (or its host stopped and its lease has not lapsed yet): running it
        # again would do the work twice, which is what the key exists to prevent.
        running = RetrievalError(
            ErrorCode.CONTEXT_REPLAY_UNAVAILABLE,
            f"the run with this idempotencyKey ({existing.run_id}) has not finished; ask "
            "again once GET /v1/runs/{id} shows it completed to receive its result. A run "
            "whose host stopped before it ended reads as failed (INTERRUPTED) once its lease "
            "lapses (runs.leaseS); send it again with a new key then.",
            reason=ContextReplayUnavailableReason.IN_PROGRESS,
        )
        running.run_id = existing.run_id  # `runId` in the problem: what to poll
        raise running
    if existing.status != "completed" or existing.result is None:
        raise RetrievalError(
            ErrorCode.CONTEXT_REPLAY_UNAVAILABLE,
            "the run with this idempotencyKey did not complete, so it has no complete "
            "evidence snapshot to replay; reconcile it and use a new key.",
            reason=ContextReplayUnavailableReason.NOT_COMPLETED,
        )
    reauthorize_manifest(retrieval, existing.result, context)
    emit(RunStarted(existing.run_id, existing.created_at))
    if existing.result.text:
        emit(RunDelta(existing.result.text))
    emit(RunCompleted(replace(existing.result, replayed=True)))

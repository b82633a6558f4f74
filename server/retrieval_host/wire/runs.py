"""Runs on the wire: the run request model to core, and run events, results and records to
their public JSON (camelCase).

This is the public format only. Run stores keep results in their own versioned format
(`wire/run_storage.py`), so this module may change with the wire without touching records.
"""

from __future__ import annotations

from typing import Any

from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs_model import (
    CitationPolicy,
    CitationReport,
    FallbackAction,
    Fallbacks,
    FixedAnswer,
    OutputArtifactSpec,
    RunCompleted,
    RunDelta,
    RunEvent,
    RunProgress,
    RunRequest,
    RunResult,
    RunRetrieval,
    RunStarted,
)
from retrieval_host.wire.problems import problem_body, retry_after
from retrieval_host_client import run_models as wire


def run_request(body: wire.RunRequest) -> RunRequest:
    """The core request of a validated `POST /v1/runs` body."""
    r = body.retrieval
    a = body.output_artifact
    return RunRequest(
        provider=body.provider,
        model=body.model,
        input=body.input,
        retrieval=None
        if r is None
        else RunRetrieval(
            corpus=r.corpus,
            mode=r.mode,
            source_ids=None if r.source_ids is None else tuple(r.source_ids),
            query=r.query,
            limit=r.limit,
            max_context_bytes=r.max_context_bytes,
            max_queries=r.max_queries,
            search_mode=r.search_mode,
            rerank=r.rerank,
            max_rerank_calls=r.max_rerank_calls,
            max_age_s=r.max_age_s,
            filters=None if r.filters is None else dict(r.filters),
            min_score=r.min_score,
        ),
        output_artifact=None if a is None else OutputArtifactSpec(a.name, a.media_type),
        idempotency_key=body.idempotency_key,
        idle_timeout_ms=body.idle_timeout_ms,
        max_generation_steps=body.max_generation_steps,
        max_tokens=body.max_tokens,
        max_attempts=body.max_attempts,
        fallbacks=Fallbacks()
        if body.fallbacks is None
        else Fallbacks(
            no_evidence=_action(body.fallbacks.no_evidence),
            source_unavailable=_action(body.fallbacks.source_unavailable),
            invalid_citation=_action(body.fallbacks.invalid_citation),
            search_failed=None
            if body.fallbacks.search_failed is None
            else _action(body.fallbacks.search_failed),
            answer_rejected=_action(body.fallbacks.answer_rejected),
        ),
        citations=None
        if body.citations is None
        else CitationPolicy(require=body.citations.require, quotes=body.citations.quotes),
    )


def _action(action: wire.FallbackAnswer | str) -> FallbackAction | FixedAnswer:
    if isinstance(action, wire.FallbackAnswer):
        return FixedAnswer(action.answer)
    return "continue" if action == "continue" else "fail"


def event_json(event: RunEvent, request_id: str) -> dict[str, Any]:
    """The wire form of a run event (camelCase; progress context flattened beside `phase`)."""
    if isinstance(event, RunStarted):
        return {"type": event.type, "runId": event.run_id, "createdAt": event.created_at}
    if isinstance(event, RunProgress):
        return {**event.context, "type": event.type, "phase": event.phase}
    if isinstance(event, RunDelta):
        return {"type": event.type, "text": event.text}
    if isinstance(event, RunCompleted):
        return {"type": event.type, "result": result_to_json(event.result)}
    error = event.error
    return {
        "type": event.type,
        "runId": event.run_id,
        "problem": problem_body(
            error.code,
            error.detail,
            request_id,
            reason=error.reason,
            run_id=event.run_id or None,
            retry_after_s=retry_after(error),
        ),
    }


def run_record_json(record: RunRecord) -> dict[str, Any]:
    """The body of `GET /v1/runs/{id}`: the record's status and, once completed, its result."""
    return {
        "runId": record.run_id,
        "status": record.status,
        "createdAt": record.created_at,
        "result": None if record.result is None else result_to_json(record.result),
        "errorCode": record.error_code,
    }


def location_to_json(loc: Location) -> dict[str, Any]:
    """A passage location with its unset fields left out."""
    body = {
        "page": loc.page,
        "startLine": loc.start_line,
        "endLine": loc.end_line,
        "documentId": loc.document_id,
    }
    return {k: v for k, v in body.items() if v is not None}


def result_to_json(result: RunResult) -> dict[str, Any]:
    """The public JSON of a run result (the `run.completed` event, the JSON answer, `GET`)."""
    return {
        "runId": result.run_id,
        "status": result.status,
        "provider": result.provider,
        "model": result.model,
        "text": result.text,
        # How the answer ended: "stop", "length", "content-filter", "other" (null: a record
        # written before runs kept it).
        "finishReason": result.finish_reason,
        "sources": [
            {
                "id": s.id,
                "origin": s.origin,
                "source": {"id": s.source_id, "revision": s.revision},
                "title": s.title,
                "location": location_to_json(s.location),
            }
            for s in result.sources
        ],
        "receipts": [
            {
                "sequence": r.sequence,
                "query": r.query,
                "key": r.key,
                "startedAt": r.started_at,
                "status": r.status,
                "sourceIds": list(r.source_ids),
                "errorCode": r.error_code,
                "searchMode": r.search_mode,
                "outcome": r.outcome,
                "rawQuery": r.raw_query,
                "success": r.success,
                "extensions": dict(r.extensions),
                "effectError": None if r.effect_error is None else dict(r.effect_error),
                "rawHits": [{"chunkId": h.chunk_id, "score": h.score} for h in r.raw_hits],
            }
            for r in result.receipts
        ],
        "usage": {
            "generation": {
                "requests": result.usage.generation.requests,
                "inputTokens": result.usage.generation.input_tokens,
                "outputTokens": result.usage.generation.output_tokens,
            },
            "embedding": {
                "requests": result.usage.embedding.requests,
                "inputTokens": result.usage.embedding.input_tokens,
            },
            "rerank": {
                "requests": result.usage.rerank.requests,
                "documents": result.usage.rerank.documents,
                "inputTokens": result.usage.rerank.input_tokens,
            },
        },
        "artifact": None
        if result.artifact is None
        else {
            "name": result.artifact.name,
            "mediaType": result.artifact.media_type,
            "sourceIds": list(result.artifact.source_ids),
        },
        "corpus": result.corpus,
        "createdAt": result.created_at,
        "completedAt": result.completed_at,
        "replayed": result.replayed,
        "citations": citations_to_json(result.citations),
        "fallbacks": [{"outcome": f.outcome, "action": f.action} for f in result.fallbacks],
        "verification": result.verification,
        "state": None
        if result.state is None
        else {
            "queryCount": result.state.query_count,
            "maxQueries": result.state.max_queries,
            "seen": list(result.state.seen),
            "sources": list(result.state.sources),
        },
    }


def citations_to_json(report: CitationReport | None) -> dict[str, Any] | None:
    """The host's citation check of a result (null when the run did not ask for one)."""
    if report is None:
        return None
    return {
        "cited": [
            {"id": c.id, "quotes": [{"text": q.text, "found": q.found} for q in c.quotes]}
            for c in report.cited
        ],
        "failure": report.failure,
    }

"""How run stores keep a run result: a versioned document of its own, not the public wire.

Version 2 (this release) is a JSON object that names its format and version, with the fields
of `RunResult` under their core (snake_case) names:

    {"format": "retrieval-host/run-result", "version": 2, "run_id": ..., "provider": ...,
     "model": ..., "text": ..., "sources": [...], "receipts": [...], "usage": {...},
     "artifact": ... | null, "corpus": ... | null, "created_at": ..., "completed_at": ...,
     "replayed": false}

`usage.rerank`, `citations` (the host's citation check: `[{"id", "quotes": [{"text",
"found"}]}]` or null), `citation_failure`, `fallbacks` (`[{"outcome", "action"}]`), `state`,
`verification`, `namespace` (where the evidence was read), the sources' `text_sha256`
(the digest of each passage's text as the run read it) and the receipts' `raw_query`,
`success`, `extensions` and `effect_error`, and `finish_reason` (how the answer ended) were
added to version 2 without a bump: a record written before them has none and reads as no
reranking, no check, no fallback, no state, no verdict, no namespace and an unknown finish
(None), and a host that predates them ignores the keys.

Version 1 has no version field: the previous release stored the public wire JSON of the
result (`wire.runs.result_to_json` as it was then: camelCase, locations without their unset
fields). Such records are read by `_from_version_1`, a frozen copy of that release's reader,
so the public wire can change without rewriting records or breaking old ones.

A record of a later version than this host knows is refused with `STORE_UNAVAILABLE`
(reason `record-version`) rather than guessed at: a rolled-back replica must not serve a
result it would misread. Adding a version means: bump `STORAGE_VERSION`, write the new shape,
and keep a reader for every older one (tests/wire/test_run_storage.py pins each).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage, Location, RerankUsage
from retrieval_host.core.reasons import StoreUnavailableReason
from retrieval_host.core.runs_model import (
    CitationReport,
    CitedSource,
    FallbackApplied,
    GenerationUsage,
    ManifestEntry,
    OutputArtifact,
    QuoteCheck,
    RawHit,
    Receipt,
    RetrievalState,
    RunResult,
    RunUsage,
)

FORMAT: Final = "retrieval-host/run-result"
STORAGE_VERSION: Final = 2


def _raw_hits(hits: Sequence[RawHit]) -> list[list[object]]:
    return [[h.chunk_id, h.score] for h in hits]


def encode_result(result: RunResult) -> str:
    """The stored text of a run result (current version)."""
    usage = result.usage
    artifact = result.artifact
    document = {
        "format": FORMAT,
        "version": STORAGE_VERSION,
        "run_id": result.run_id,
        "provider": result.provider,
        "model": result.model,
        "text": result.text,
        "sources": [
            {
                "id": s.id,
                "source_id": s.source_id,
                "revision": s.revision,
                "title": s.title,
                "origin": s.origin,
                "text_sha256": s.text_sha256,
                "location": {
                    "page": s.location.page,
                    "start_line": s.location.start_line,
                    "end_line": s.location.end_line,
                    "document_id": s.location.document_id,
                },
            }
            for s in result.sources
        ],
        "receipts": [
            {
                "sequence": r.sequence,
                "query": r.query,
                "key": r.key,
                "started_at": r.started_at,
                "status": r.status,
                "source_ids": list(r.source_ids),
                "error_code": r.error_code,
                "search_mode": r.search_mode,
                "raw_query": r.raw_query,
                "success": r.success,
                "extensions": dict(r.extensions),
                "effect_error": None if r.effect_error is None else dict(r.effect_error),
                "raw_hits": _raw_hits(r.raw_hits),
            }
            for r in result.receipts
        ],
        "usage": {
            "generation": {
                "requests": usage.generation.requests,
                "input_tokens": usage.generation.input_tokens,
                "output_tokens": usage.generation.output_tokens,
            },
            "embedding": {
                "requests": usage.embedding.requests,
                "input_tokens": usage.embedding.input_tokens,
            },
            "rerank": {
                "requests": usage.rerank.requests,
                "documents": usage.rerank.documents,
                "input_tokens": usage.rerank.input_tokens,
            },
        },
        "artifact": None
        if artifact is None
        else {
            "name": artifact.name,
            "media_type": artifact.media_type,
            "source_ids": list(artifact.source_ids),
        },
        "corpus": result.corpus,
        "namespace": result.namespace,
        "created_at": result.created_at,
        "completed_at": result.completed_at,
        "replayed": result.replayed,
        "citations": None
        if result.citations is None
        else [
            {"id": c.id, "quotes": [{"text": q.text, "found": q.found} for q in c.quotes]}
            for c in result.citations.cited
        ],
        "citation_failure": None if result.citations is None else result.citations.failure,
        "fallbacks": [{"outcome": f.outcome, "action": f.action} for f in result.fallbacks],
        "verification": result.verification,
        "finish_reason": result.finish_reason,
        "state": None
        if result.state is None
        else {
            "query_count": result.state.query_count,
            "max_queries": result.state.max_queries,
            "seen": list(result.state.seen),
            "sources": list(result.state.sources),
        },
    }
    return json.dumps(document, separators=(",", ":"))


def decode_result(text: str) -> RunResult:
    """The run result of a stored text of any version this host knows."""
    document = json.loads(text)
    version = document.get("version", 1)
    if version == 1:
        return _from_version_1(document)
    if version == STORAGE_VERSION and document.get("format") == FORMAT:
        return _from_version_2(document)
    raise RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"a run record has storage version {version!r}; this host reads up to {STORAGE_VERSION}.",
        reason=StoreUnavailableReason.RECORD_VERSION,
    )


def _from_version_2(body: Mapping[str, Any]) -> RunResult:
    usage = body["usage"]
    artifact = body["artifact"]
    return RunResult(
        run_id=body["run_id"],
        status="completed",
        provider=body["provider"],
        model=body["model"],
        text=body["text"],
        sources=[
            ManifestEntry(
                id=s["id"],
                source_id=s["source_id"],
                revision=s["revision"],
                location=Location(
                    page=s["location"]["page"],
                    start_line=s["location"]["start_line"],
                    end_line=s["location"]["end_line"],
                    document_id=s["location"]["document_id"],
                ),
                title=s["title"],
                origin=s["origin"],
                text_sha256=s.get("text_sha256"),
            )
            for s in body["sources"]
        ],
        receipts=[
            Receipt(
                sequence=r["sequence"],
                query=r["query"],
                key=r["key"],
                started_at=r["started_at"],
                status=r["status"],
                source_ids=list(r["source_ids"]),
                error_code=r["error_code"],
                search_mode=r.get("search_mode"),
                raw_query=r.get("raw_query"),
                success=r.get("success"),
                extensions=dict(r.get("extensions") or {}),
                effect_error=r.get("effect_error"),
                raw_hits=[RawHit(str(c), float(v)) for c, v in r.get("raw_hits") or ()],
            )
            for r in body["receipts"]
        ],
        usage=RunUsage(
            GenerationUsage(
                usage["generation"]["requests"],
                usage["generation"]["input_tokens"],
                usage["generation"]["output_tokens"],
            ),
            EmbeddingUsage(usage["embedding"]["requests"], usage["embedding"]["input_tokens"]),
            _rerank_usage(usage.get("rerank")),
        ),
        created_at=body["created_at"],
        completed_at=body["completed_at"],
        artifact=None
        if artifact is None
        else OutputArtifact(artifact["name"], artifact["media_type"], list(artifact["source_ids"])),
        corpus=body["corpus"],
        namespace=body.get("namespace"),
        replayed=bool(body["replayed"]),
        citations=_citations(body.get("citations"), body.get("citation_failure")),
        fallbacks=tuple(
            FallbackApplied(f["outcome"], f["action"]) for f in body.get("fallbacks") or ()
        ),
        state=_state(body.get("state")),
        verification=body.get("verification"),
        finish_reason=body.get("finish_reason"),
    )


def _state(body: Mapping[str, Any] | None) -> RetrievalState | None:
    if body is None:
        return None
    return RetrievalState(
        body["query_count"], body["max_queries"], tuple(body["seen"]), tuple(body["sources"])
    )


def _citations(body: list[Any] | None, failure: str | None) -> CitationReport | None:
    """The citation check of a version-2 record; none in records written before it."""
    if body is None:
        return None
    return CitationReport(
        [
            CitedSource(
                c["id"], tuple(QuoteCheck(q["text"], bool(q["found"])) for q in c["quotes"])
            )
            for c in body
        ],
        failure,
    )


def _from_version_1(body: Mapping[str, Any]) -> RunResult:
    """The previous release's reader, unchanged: do not edit it to follow the public wire."""
    usage = body["usage"]
    artifact = body.get("artifact")
    return RunResult(
        run_id=body["runId"],
        status="completed",
        provider=body["provider"],
        model=body["model"],
        text=body["text"],
        sources=[
            ManifestEntry(
                id=s["id"],
                source_id=s["source"]["id"],
                revision=s["source"]["revision"],
                location=_location_version_1(s.get("location", {})),
                title=s.get("title", ""),
            )
            for s in body["sources"]
        ],
        receipts=[
            Receipt(
                sequence=r["sequence"],
                query=r["query"],
                key=r["key"],
                started_at=r["startedAt"],
                status=cast(Any, r["status"]),
                source_ids=list(r["sourceIds"]),
                error_code=r.get("errorCode"),
                search_mode=r.get("searchMode"),
            )
            for r in body["receipts"]
        ],
        usage=RunUsage(
            GenerationUsage(
                usage["generation"]["requests"],
                usage["generation"]["inputTokens"],
                usage["generation"]["outputTokens"],
            ),
            EmbeddingUsage(usage["embedding"]["requests"], usage["embedding"]["inputTokens"]),
        ),
        created_at=body["createdAt"],
        completed_at=body["completedAt"],
        artifact=None
        if artifact is None
        else OutputArtifact(artifact["name"], artifact["mediaType"], list(artifact["sourceIds"])),
        corpus=body.get("corpus"),
        replayed=bool(body.get("replayed", False)),
    )


def _rerank_usage(body: Mapping[str, Any] | None) -> RerankUsage:
    """Reranking usage of a version-2 record; none in records written before reranking."""
    if body is None:
        return RerankUsage()
    return RerankUsage(body["requests"], body["documents"], body["input_tokens"])


def _location_version_1(body: Mapping[str, Any]) -> Location:
    return Location(
        page=body.get("page"),
        start_line=body.get("startLine"),
        end_line=body.get("endLine"),
        document_id=body.get("documentId"),
    )

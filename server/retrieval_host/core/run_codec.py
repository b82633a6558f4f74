"""Run results to and from their public JSON shape (camelCase), used for records and the wire."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from retrieval_host.core.models import EmbeddingUsage, Location
from retrieval_host.core.runs_model import (
    GenerationUsage,
    ManifestEntry,
    OutputArtifact,
    Receipt,
    RunResult,
    RunUsage,
)


def location_to_json(loc: Location) -> dict[str, Any]:
    body = {
        "page": loc.page,
        "startLine": loc.start_line,
        "endLine": loc.end_line,
        "documentId": loc.document_id,
    }
    return {k: v for k, v in body.items() if v is not None}


def location_from_json(body: Mapping[str, Any]) -> Location:
    return Location(
        page=body.get("page"),
        start_line=body.get("startLine"),
        end_line=body.get("endLine"),
        document_id=body.get("documentId"),
    )


def result_to_json(result: RunResult) -> dict[str, Any]:
    return {
        "runId": result.run_id,
        "status": result.status,
        "provider": result.provider,
        "model": result.model,
        "text": result.text,
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
    }


def result_from_json(body: Mapping[str, Any]) -> RunResult:
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
                location=location_from_json(s.get("location", {})),
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

"""Retrieval on the wire: request models (camelCase, pydantic) to core dataclasses (snake_case,
no I/O), and results back to response models or, on the hot search path, straight to JSON.

Kept out of core: the client package knows nothing of core, and core nothing of the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic_core

from retrieval_host.core import inspection
from retrieval_host.core import models as core
from retrieval_host.core.validation import shown_metadata
from retrieval_host_client import models as wire


def search_request(body: wire.SearchRequest) -> core.SearchRequest:
    return core.SearchRequest(
        corpus=body.corpus,
        query=body.query,
        source_ids=body.source_ids,
        limit=body.limit,
        max_context_bytes=body.max_context_bytes,
        filters=dict(body.filters) if body.filters is not None else None,
        mode=body.mode,
        min_score=body.min_score,
        rerank=body.rerank,
        max_age_s=body.max_age_s,
    )


def _location_in(loc: wire.LocationInput) -> core.Location:
    return core.Location(loc.page, loc.start_line, loc.end_line, loc.document_id)


def index_request(body: wire.IndexRequest) -> core.IndexRequest:
    return core.IndexRequest(
        corpus=body.corpus,
        source=core.SourceInfo(
            body.source.id, body.source.revision, body.source.title, dict(body.source.metadata)
        ),
        chunks=tuple(core.ChunkInput(c.id, c.text, _location_in(c.location)) for c in body.chunks),
        document_sha256=body.document_sha256,
    )


def delete_request(body: wire.DeleteRequest) -> core.DeleteRequest:
    return core.DeleteRequest(body.corpus, body.source_id, body.revision)


def _source(ref: core.SourceRef) -> wire.SourceRef:
    return wire.SourceRef(id=ref.id, revision=ref.revision)


def _usage(usage: core.EmbeddingUsage) -> wire.Usage:
    return wire.Usage(
        embedding=wire.EmbeddingUsage(requests=usage.requests, input_tokens=usage.input_tokens)
    )


def search_response_json(result: core.SearchResult) -> bytes:
    """The JSON of `search_response(result)`, byte for byte, without building the models.

    The hot path of every search: plain dicts in the models' field order with their camelCase
    names, serialized by pydantic-core, cost about a third of validating the models and
    dumping them. tests/wire/test_search_json.py holds it to the models' output.
    """
    return pydantic_core.to_json(_search_body(result))


def search_response(result: core.SearchResult) -> wire.SearchResponse:
    """The models of a search response (the host answers with `search_response_json`)."""
    return wire.SearchResponse.model_validate(_search_body(result))


def _search_body(result: core.SearchResult) -> dict[str, Any]:
    scope = _scope(result.scope) if result.scope is not None else None
    return {
        "hits": [
            {
                "chunkId": h.chunk_id,
                "source": {"id": h.source.id, "revision": h.source.revision},
                "location": {
                    "page": h.location.page,
                    "startLine": h.location.start_line,
                    "endLine": h.location.end_line,
                    "documentId": h.location.document_id,
                },
                "text": h.text,
                "documentSha256": h.document_sha256,
                "score": float(h.score),
                "retrievedAt": h.retrieved_at,
                "scope": scope if h.scope == result.scope else _scope(h.scope),
                "scores": {
                    "dense": h.scores.get("dense"),
                    "lexical": h.scores.get("lexical"),
                    "rerank": h.scores.get("rerank"),
                },
                "metadata": shown_metadata(h.metadata),
                "indexedAt": h.indexed_at,
            }
            for h in result.hits
        ],
        "truncated": result.truncated,
        "retrievedAt": result.retrieved_at,
        "scope": scope,
        "usage": {
            "embedding": {
                "requests": result.usage.requests,
                "inputTokens": result.usage.input_tokens,
            },
            "rerank": {
                "requests": result.rerank_usage.requests,
                "documents": result.rerank_usage.documents,
                "inputTokens": result.rerank_usage.input_tokens,
            },
        },
    }


def _scope(scope: core.Scope) -> dict[str, str]:
    return {
        "corpus": scope.corpus,
        "indexVersion": scope.index_version,
        "namespace": scope.namespace,
    }


def index_response(result: core.IndexResult) -> wire.IndexResponse:
    return wire.IndexResponse(
        corpus=result.corpus,
        source=_source(result.source),
        status=result.status,
        chunk_count=result.chunk_count,
        document_sha256=result.document_sha256,
        replaced_revision=result.replaced_revision,
        usage=_usage(result.usage),
    )


# Progress reports of an ingest (`Driver.ingest_context`, `core.indexing`) and the phase each
# one is on the wire; other reports (authorization, scans) are not ingest progress.
_INGEST_PHASES = {"ingest.parse": "parse", "index.embedding": "embed", "index.commit": "commit"}


def ingest_progress_json(phase: str, details: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `ingest.progress` event of a progress report, or None for another kind of report.
    `passagesTotal` is null until the document is parsed; a commit has done them all."""
    name = _INGEST_PHASES.get(phase)
    if name is None:
        return None
    total = details.get("total")
    return {
        "type": "ingest.progress",
        "phase": name,
        "passagesDone": details.get("done", total),
        "passagesTotal": total,
    }


def delete_response(result: core.DeleteResult) -> wire.DeleteResponse:
    return wire.DeleteResponse(
        corpus=result.corpus,
        source=_source(result.source),
        deleted_chunks=result.deleted_chunks,
        reclamation=result.reclamation,
    )


# --- inspection -----------------------------------------------------------------------------


def _location(loc: core.Location) -> wire.Location:
    return wire.Location(
        page=loc.page, start_line=loc.start_line, end_line=loc.end_line, document_id=loc.document_id
    )


def corpora_response(
    corpora: list[inspection.CorpusSummary],
    operations: dict[str, list[core.Operation]],
    write_only: dict[str, list[core.Operation]] | None = None,
) -> wire.CorporaResponse:
    """`operations`: the token's grants per corpus id (the in-process API has no tokens);
    `write_only`: those of the corpora it may write to but not search."""
    return wire.CorporaResponse(
        write_only=[
            wire.WriteOnlyCorpus(id=corpus_id, operations=ops)
            for corpus_id, ops in (write_only or {}).items()
        ],
        corpora=[
            wire.CorpusInfo(
                id=c.id,
                version=c.version,
                embedding=wire.EmbeddingLabels(
                    provider_id=c.embedding.provider_id,
                    vendor=c.embedding.vendor,
                    model=c.embedding.model,
                    dimensions=c.embedding.dimensions,
                    metric=c.embedding.metric,
                ),
                operations=operations.get(c.id, []),
                sources=c.sources,
                passages=c.passages,
                bytes=c.bytes,
                read_only=c.read_only,
            )
            for c in corpora
        ],
    )


def _source_listing(s: inspection.SourceSummary) -> wire.SourceListing:
    return wire.SourceListing(
        id=s.id,
        revision=s.revision,
        title=s.title,
        media_type=s.media_type,
        metadata=dict(shown_metadata(s.metadata)),
        chunk_count=s.chunk_count,
        bytes=s.bytes,
        indexed_at=s.indexed_at,
    )


def sources_response(page: inspection.SourcePage) -> wire.SourcesResponse:
    return wire.SourcesResponse(
        sources=[_source_listing(s) for s in page.sources], next_cursor=page.next_cursor
    )


def source_response(detail: inspection.SourceDetail) -> wire.SourceResponse:
    return wire.SourceResponse(
        source=_source_listing(detail.source),
        passages=[
            wire.PassageListing(chunk_id=p.chunk_id, location=_location(p.location), bytes=p.bytes)
            for p in detail.passages
        ],
        next_cursor=detail.next_cursor,
    )


def passage_response(passage: inspection.Passage) -> wire.PassageResponse:
    return wire.PassageResponse(
        chunk_id=passage.chunk_id,
        source=_source(passage.source),
        location=_location(passage.location),
        text=passage.text,
        document_sha256=passage.document_sha256,
        retrieved_at=passage.retrieved_at,
        scope=wire.Scope.model_validate(_scope(passage.scope)),
        metadata=dict(shown_metadata(passage.metadata)),
    )

"""Retrieval on the wire: request models (camelCase, pydantic) to core dataclasses (snake_case,
no I/O), and results back to response models or, on the hot search path, straight to JSON.

Kept out of core: the client package knows nothing of core, and core nothing of the wire.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from retrieval_host.core import models as core
from retrieval_host_client import models as wire


def search_request(body: wire.SearchRequest) -> core.SearchRequest:
    return core.SearchRequest(
        corpus=body.corpus,
        query=body.query,
        source_ids=body.source_ids,
        limit=body.limit,
        max_context_bytes=body.max_context_bytes,
        filters=dict(body.filters) if body.filters is not None else None,
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
            }
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


def delete_response(result: core.DeleteResult) -> wire.DeleteResponse:
    return wire.DeleteResponse(
        corpus=result.corpus,
        source=_source(result.source),
        deleted_chunks=result.deleted_chunks,
        reclamation=result.reclamation,
    )

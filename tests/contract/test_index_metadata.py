"""Prepared passages' `source.metadata`: any JSON object within 16 KiB, never a NUL.

A black-box tester indexed metadata holding NUL through `POST /v1/retrieval/index`: SQLite kept
it and gave it back, while PostgreSQL cannot store NUL in `jsonb` and no filter can name it.
Both stores now get the same refusal, before anything is embedded or written."""

from __future__ import annotations

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, JSONValue, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness


def _grant(request: AuthorizationRequest, context: RequestContext) -> Grant:
    if request.operation == "search":
        return Grant("ns", {"s": "r1"})
    return Grant("ns", {sid: ANY_REVISION for sid in request.source_ids or ()})


def _index(service: RetrievalService, metadata: dict[str, JSONValue]) -> None:
    service.index_context(
        IndexRequest(
            "docs",
            SourceInfo("s", "r1", title="S", metadata=metadata),
            [ChunkInput("s-0", "Close the valve.", Location(start_line=1))],
        ),
        RequestContext("writer"),
    )


@pytest.mark.parametrize(
    "metadata",
    [{"k": "a\x00b"}, {"k\x00": 1}, {"nested": [{"deep": "\x00"}]}],
    ids=["value", "key", "nested"],
)
def test_metadata_holding_nul_is_refused_before_anything_is_written(
    harness: StoreHarness, local_embedding: LocalEmbedding, metadata: dict[str, JSONValue]
) -> None:
    store = harness.open()
    service = RetrievalService([Corpus("docs", "v1", local_embedding, store, _grant)])
    with pytest.raises(RetrievalError) as info:
        _index(service, metadata)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "NUL" in info.value.detail
    assert store.current_revisions("docs", "ns") == {}


def test_nested_metadata_of_prepared_passages_is_kept_as_given(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    store = harness.open()
    service = RetrievalService([Corpus("docs", "v1", local_embedding, store, _grant)])
    metadata: dict[str, JSONValue] = {"team": {"name": "ops", "tags": ["a", "b"]}, "k": "a\\u0000"}
    _index(service, metadata)
    assert service.get_source("docs", "s", RequestContext("reader")).source.metadata == metadata

"""Prepared passages' `source.metadata`: any JSON object within 16 KiB of UTF-8 and 32 levels,
never a NUL.

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
from retrieval_host.core.validation import MAX_METADATA_BYTES, MAX_METADATA_DEPTH
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


def test_metadata_bytes_are_counted_in_utf8_and_its_depth_is_bounded(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    # A black-box test: `é` counted the 6 bytes of its escape, so 5.4 KB of UTF-8 was refused
    # as over 16 KiB; and metadata 300 deep was stored in-process, then every answer holding
    # it was a 500 (the reply could not be serialized).
    store = harness.open()
    service = RetrievalService([Corpus("docs", "v1", local_embedding, store, _grant)])
    fits: dict[str, JSONValue] = {"k": "é" * ((MAX_METADATA_BYTES - 10) // 2)}
    _index(service, fits)
    assert service.get_source("docs", "s", RequestContext("reader")).source.metadata == fits
    deep: JSONValue = 1
    for _ in range(MAX_METADATA_DEPTH):
        deep = [deep]
    refused: list[tuple[dict[str, JSONValue], str]] = [
        ({"k": "é" * 8200}, "16384 bytes"),
        ({"k": deep}, "32 levels"),
    ]
    for metadata, words in refused:
        with pytest.raises(RetrievalError) as info:
            _index(service, metadata)
        assert info.value.code is ErrorCode.INVALID_REQUEST
        assert words in info.value.detail
    for _ in range(5_000):  # far past what json.dumps can recurse into
        deep = [deep]
    with pytest.raises(RetrievalError):
        _index(service, {"k": deep})
    assert store.current_revisions("docs", "ns") == {"s": "r1"}


def test_the_bound_counts_compact_json_and_an_object_sharing_its_parts_is_refused_at_once(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    # Black-box tests: the count added a space after every `:` and `,` (flat metadata of
    # 14,000 compact bytes was refused as over 16 KiB); an in-process object built as
    # `a = [a, a]` many times over was walked path by path before its refusal (doubling per
    # level: minutes at 30); an integer key was stored as a string.
    store = harness.open()
    service = RetrievalService([Corpus("docs", "v1", local_embedding, store, _grant)])
    flat: dict[str, JSONValue] = {f"k{i:04}": "v" * 3 for i in range(1_170)}  # 16,381 bytes
    _index(service, flat)
    assert service.get_source("docs", "s", RequestContext("reader")).source.metadata == flat
    shared: JSONValue = [1]
    for _ in range(30):
        shared = [shared, shared]  # 2**30 leaves, 31 levels
    with pytest.raises(RetrievalError) as info:
        _index(service, {"k": shared})
    assert "16384 bytes" in info.value.detail
    with pytest.raises(RetrievalError) as keyed:
        _index(service, {"k": {1: "a"}})  # type: ignore[dict-item]
    assert "keys must be strings" in keyed.value.detail

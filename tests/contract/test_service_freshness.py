"""Freshness over each store: `maxAgeS` reads only revisions committed recently enough, chosen
with authorization before ranking, and every hit says when its revision was committed."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, SearchRequest, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, CapacityLimits, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_with_store import GrantBook
from tests.support.sqlite_store import revision, unit_vectors

TEXT = "Otters hold hands while they sleep."


class Clock:
    """The service's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = "2026-12-01T10:00:00.000Z"

    def __call__(self) -> str:
        return self.now


@pytest.fixture
def world(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> tuple[RetrievalService, GrantBook, Clock]:
    book = GrantBook()
    book.grants["index"] = Grant("team", {s: ANY_REVISION for s in ("old", "new", "untimed")})
    clock = Clock()
    store = harness.open()
    service = RetrievalService(
        [Corpus("docs", "passages-v1", local_embedding, store, book)], clock=clock
    )
    return service, book, clock


def _index(service: RetrievalService, source_id: str) -> None:
    chunk = ChunkInput(f"{source_id}-0", f"{TEXT} ({source_id})")
    request = IndexRequest("docs", SourceInfo(source_id, "r1", source_id), [chunk])
    assert service.index_context(request, RequestContext("writer")).status == "indexed"


def test_max_age_reads_only_recent_revisions_and_hits_say_when(
    world: tuple[RetrievalService, GrantBook, Clock],
) -> None:
    service, book, clock = world
    _index(service, "old")
    clock.now = "2026-12-01T11:00:00.000Z"
    _index(service, "new")
    # A revision written by a release that did not record commit times.
    store = service.corpus("docs").store
    dims = service.corpus("docs").embedding.descriptor.dimensions
    source, chunks = revision("untimed", "r1", unit_vectors(np.random.default_rng(1), 1, dims))
    store.replace_source(
        "docs", "team", source, chunks, expected_revision=None, limits=CapacityLimits()
    )
    book.grants["search"] = Grant("team", {"old": "r1", "new": "r1", "untimed": "r1"})
    clock.now = "2026-12-01T11:30:00.000Z"

    def found(max_age_s: float | None) -> dict[str, str | None]:
        result = service.search_context(
            SearchRequest("docs", "otters", limit=10, max_age_s=max_age_s), RequestContext("u")
        )
        return {h.source.id: h.indexed_at for h in result.hits}

    assert found(None) == {
        "old": "2026-12-01T10:00:00.000Z",
        "new": "2026-12-01T11:00:00.000Z",
        "untimed": None,
    }
    assert found(3600.0) == {"new": "2026-12-01T11:00:00.000Z"}  # 30 min old; the other 90
    assert found(7200.0) == {"old": "2026-12-01T10:00:00.000Z", "new": "2026-12-01T11:00:00.000Z"}
    assert found(60.0) == {}
    # Freshness narrows the grant; it never widens it.
    book.grants["search"] = Grant("team", {"old": "r1"})
    assert found(7200.0) == {"old": "2026-12-01T10:00:00.000Z"}


def test_max_age_must_be_a_positive_finite_number(
    world: tuple[RetrievalService, GrantBook, Clock],
) -> None:
    service, _, _ = world
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(RetrievalError) as excinfo:
            service.search_context(SearchRequest("docs", "q", max_age_s=bad), RequestContext("u"))
        assert excinfo.value.code is ErrorCode.INVALID_REQUEST


def test_the_store_reports_current_revisions_and_their_commit_times(
    world: tuple[RetrievalService, GrantBook, Clock],
) -> None:
    service, _, _ = world
    _index(service, "old")
    store = service.corpus("docs").store
    assert store.indexed_at("docs", "team", ["old", "missing"]) == {
        "old": ("r1", "2026-12-01T10:00:00.000Z")
    }
    assert store.indexed_at("docs", "team", []) == {}
    assert store.indexed_at("docs", "elsewhere", ["old"]) == {}

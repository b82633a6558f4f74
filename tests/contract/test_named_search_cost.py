"""A search naming its sources checks the grant once per check, not once per named source.

The after-read check rebuilt the grant's searchable map for every named source (`any(sid not
in searchable(recheck) for sid in ...)`): quadratic in the names. With the 10,000 a search
may name and a grant of as many, that is 10^8 dictionary steps, seconds of CPU per request
(session 41, found reading the code).
"""

from __future__ import annotations

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core import grants, search
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness

SOURCES = [f"s{i}" for i in range(60)]


def _grant(request: AuthorizationRequest, context: RequestContext) -> Grant:
    revision = ANY_REVISION if request.operation == "index" else "r1"
    return Grant("team", dict.fromkeys(SOURCES, revision))


def test_a_search_naming_many_sources_reads_the_grant_a_bounded_number_of_times(
    harness: StoreHarness, local_embedding: LocalEmbedding, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = RetrievalService([Corpus("docs", "v1", local_embedding, harness.open(), _grant)])
    for n, sid in enumerate(SOURCES):
        chunk = ChunkInput(f"{sid}-0", f"Note {n} about otters and rivers.", Location(1, 1))
        service.index_context(
            IndexRequest("docs", SourceInfo(sid, "r1"), [chunk]), RequestContext("ops")
        )
    calls = []

    def counted(grant: Grant) -> dict[str, str]:
        calls.append(len(grant.sources))
        return grants.searchable(grant)

    monkeypatch.setattr(search, "searchable", counted)
    found = service.search_context(
        SearchRequest("docs", "otters", source_ids=SOURCES, limit=5), RequestContext("reader")
    )
    assert len(found.hits) == 5
    assert 1 <= len(calls) <= 4, len(calls)  # was 60 + 2: one per named source

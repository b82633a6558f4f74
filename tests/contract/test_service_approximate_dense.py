"""A dense search ranked by an approximate index (`ApproximateRanking`) also scores the lexical
index's best exactly: a graph that cannot reach a passage among many near-identical ones must
not hide it from a query made of its own words. Over each store, with the real local model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.filters import MetadataFilter
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import (
    ANY_REVISION,
    ApproximateRanking,
    AuthorizationRequest,
    Candidate,
    Grant,
    Vectors,
    VectorStore,
)
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import ContractStore, StoreHarness

PASSAGES = [
    "Return a tuple of the current process's real, effective and saved user ids.",
    "The kelp forest shelters otters and fish.",
    "Invoices are due within thirty days of receipt.",
    "The lighthouse lamp is cleaned every week.",
]
QUERY = "the current process's real, effective and saved user ids"


class MissingGraph:
    """The store, except that its dense search acts as a graph that cannot reach the best
    passage (`approximate`), or as the exact scan (plain list)."""

    def __init__(self, store: ContractStore) -> None:
        self.store = store
        self.approximate = True
        self.lexical_searches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: MetadataFilter | None = None,
    ) -> list[Candidate]:
        found = self.store.search(corpus, namespace, allowed, query, k + 1, cancel, filters)
        if not self.approximate:
            return found[:k]
        return ApproximateRanking(found[1:])  # the best one out of reach

    def lexical_search(self, *args: Any, **kwargs: Any) -> list[Candidate]:
        self.lexical_searches += 1
        return self.store.lexical_search(*args, **kwargs)


def grant(request: AuthorizationRequest, context: RequestContext) -> Grant:
    revisions = ANY_REVISION if request.operation == "index" else "r1"
    return Grant("team", {"s": revisions})


def test_a_passage_the_graph_misses_is_found_by_its_words(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    store = harness.open()
    graph = MissingGraph(store)
    exact = RetrievalService([Corpus("docs", "passages-v1", local_embedding, store, grant)])
    service = RetrievalService(
        [Corpus("docs", "passages-v1", local_embedding, cast(VectorStore, graph), grant)]
    )
    chunks = [
        ChunkInput(f"s-{i}", text, Location(start_line=i + 1, end_line=i + 1))
        for i, text in enumerate(PASSAGES)
    ]
    exact.index_context(IndexRequest("docs", SourceInfo("s", "r1"), chunks), RequestContext("w"))

    def ranked(on: RetrievalService) -> list[tuple[str, float]]:
        result = on.search_context(
            SearchRequest("docs", QUERY, mode="dense", limit=3), RequestContext("reader")
        )
        return [(h.chunk_id, h.score) for h in result.hits]

    truth = ranked(exact)
    assert truth[0][0] == "s-0"
    found = ranked(service)
    assert [c for c, _ in found] == [c for c, _ in truth]
    assert [s for _, s in found] == pytest.approx([s for _, s in truth], abs=1e-6)
    assert graph.lexical_searches == 1

    graph.approximate = False  # an exact ranking is taken as it is: no lexical search
    ranked(service)
    assert graph.lexical_searches == 1

"""Reranking through RetrievalService over each store, with the real local embedding model and
a real `/rerank` server on loopback: only authorized passages leave the host, the order and
scores are the reranker's, failures are typed, and the reranker is pinned in the descriptor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import apsw
import psycopg
import pytest
from psycopg import sql

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.rerank_http import HttpReranker
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import CorpusDescriptor, RerankDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import (
    ChunkInput,
    IndexRequest,
    Location,
    Operation,
    RerankUsage,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.reasons import InvalidRequestReason, RerankFailedReason
from retrieval_host.core.rerank import RerankSettings
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.fake_rerank import RERANK_MODEL, FakeReranker
from tests.support.pg import schema_for, shared_dsn

PASSAGES = {
    "a": [
        "Sea otters hold hands while they sleep.",
        "Otters use rocks as tools to open shells.",
        "Kelp forests shelter many animals.",
    ],
    "b": ["The invoice is due within thirty days.", "Otters sleep in kelp, the invoice notes."],
    # Never granted for search: its text must never reach the reranker.
    "secret": ["Otters sleep holding hands: the secret memo.", "Secret otters hands sleep."],
}
QUERY = "otters sleep holding hands"


@dataclass
class Authorizer:
    """One grant per operation; `after_read` replaces the search grant from the second search
    check on (a revocation landing while the search reads)."""

    grants: dict[Operation, Grant | None] = field(default_factory=dict)
    after_read: Grant | None = None
    search_checks: int = 0

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        if request.operation == "search":
            self.search_checks += 1
            if self.search_checks > 1 and self.after_read is not None:
                return self.after_read
        return self.grants.get(request.operation)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def fake(server: FakeOpenAI) -> Iterator[FakeReranker]:
    server.reset()
    fake = FakeReranker(server)
    yield fake
    fake.close_adapters()


def http_reranker(fake: FakeReranker, model: str = RERANK_MODEL) -> HttpReranker:
    """An adapter for the fake, closed with the test's fake."""
    descriptor = RerankDescriptor("rerank-http", "cohere", "acct-1", "api-key", model)
    adapter = HttpReranker(
        descriptor=descriptor, base_url=fake.base_url, api_key=lambda: DEFAULT_API_KEY
    )
    fake.adapters.append(adapter)
    return adapter


@dataclass
class World:
    service: RetrievalService
    authorizer: Authorizer
    revisions: dict[str, str]


def build(
    harness: StoreHarness,
    embedding: LocalEmbedding,
    fake: FakeReranker,
    *,
    reranker: bool = True,
) -> World:
    authorizer = Authorizer()
    authorizer.grants["index"] = Grant("team", dict.fromkeys(PASSAGES, ANY_REVISION))
    corpus = Corpus(
        "docs",
        "passages-v1",
        embedding,
        harness.open(),
        authorizer,
        reranker=http_reranker(fake) if reranker else None,
        rerank=RerankSettings(candidates=4),
    )
    service = RetrievalService([corpus])
    revisions = {}
    for source_id, texts in PASSAGES.items():
        service.index_context(
            IndexRequest(
                "docs",
                SourceInfo(source_id, "r1", title=source_id),
                [
                    ChunkInput(f"{source_id}-{i}", t, Location(start_line=i + 1, end_line=i + 1))
                    for i, t in enumerate(texts)
                ],
            ),
            RequestContext("writer"),
        )
        revisions[source_id] = "r1"
    authorizer.grants["search"] = Grant("team", {"a": "r1", "b": "r1"})
    return World(service, authorizer, revisions)


@pytest.fixture
def world(harness: StoreHarness, local_embedding: LocalEmbedding, fake: FakeReranker) -> World:
    return build(harness, local_embedding, fake)


def search(world: World, **fields: object) -> list[tuple[str, float]]:
    result = world.service.search_context(
        SearchRequest("docs", QUERY, **fields),  # type: ignore[arg-type]
        RequestContext("reader"),
    )
    return [(h.chunk_id, h.score) for h in result.hits]


def test_a_reranked_search_is_in_the_rerankers_order_with_every_score(
    world: World, fake: FakeReranker
) -> None:
    result = world.service.search_context(
        SearchRequest("docs", QUERY, limit=3), RequestContext("reader")
    )

    (body,) = fake.requests
    # The fused top 4 (the corpus's rerank candidates) were sent, all of them to be scored.
    assert len(body["documents"]) == 4
    assert body["top_n"] == 4
    rerank_scores = [h.scores["rerank"] for h in result.hits]
    assert [h.score for h in result.hits] == rerank_scores
    assert rerank_scores == sorted(rerank_scores, reverse=True)
    assert len(result.hits) == 3 and result.truncated
    # The best passage by the reranker's rule (three of the four query words) leads.
    assert result.hits[0].chunk_id == "a-0"
    for hit in result.hits:
        assert set(hit.scores) >= {"rerank"}
        assert {"dense", "lexical"} & set(hit.scores)
    assert result.rerank_usage == RerankUsage(
        requests=1, documents=4, input_tokens=result.rerank_usage.input_tokens
    )
    assert result.rerank_usage.input_tokens > 0


@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
def test_no_passage_outside_the_grant_reaches_the_reranker(
    world: World, fake: FakeReranker, mode: str
) -> None:
    search(world, mode=mode, limit=10)
    sent = {d for body in fake.requests for d in body["documents"]}
    assert sent  # something was reranked
    assert sent <= set(PASSAGES["a"]) | set(PASSAGES["b"])


def test_a_grant_revoked_during_the_read_keeps_its_passages_from_the_reranker(
    world: World, fake: FakeReranker
) -> None:
    world.authorizer.after_read = Grant("team", {"b": "r1"})
    hits = search(world, limit=10)
    sent = {d for body in fake.requests for d in body["documents"]}
    assert sent and sent <= set(PASSAGES["b"])
    assert {chunk_id for chunk_id, _ in hits} <= {"b-0", "b-1"}


def test_a_denied_search_never_calls_the_reranker(world: World, fake: FakeReranker) -> None:
    world.authorizer.grants["search"] = None
    with pytest.raises(RetrievalError) as caught:
        search(world)
    assert caught.value.code is ErrorCode.PERMISSION_DENIED
    assert fake.requests == []


def test_rerank_false_skips_the_reranker(world: World, fake: FakeReranker) -> None:
    result = world.service.search_context(
        SearchRequest("docs", QUERY, rerank=False), RequestContext("reader")
    )
    assert fake.requests == []
    assert result.hits and all("rerank" not in h.scores for h in result.hits)
    assert result.rerank_usage == RerankUsage()


def test_a_search_that_would_rerank_calls_a_model_even_when_lexical(world: World) -> None:
    # The HTTP layer's peek (`search_calls_no_model`): a reranked search waits on the
    # reranker, so it never runs on the event loop; without reranking, lexical calls none.
    lexical = SearchRequest("docs", "alpha", mode="lexical")
    assert not world.service.search_calls_no_model(lexical, "reader")
    assert world.service.search_calls_no_model(replace(lexical, rerank=False), "reader")


def test_a_hybrid_search_calls_no_model_once_its_subjects_query_vector_is_cached(
    harness: StoreHarness, local_embedding: LocalEmbedding, fake: FakeReranker
) -> None:
    plain = build(harness, local_embedding, fake, reranker=False)
    hybrid = SearchRequest("docs", QUERY)
    assert not plain.service.search_calls_no_model(hybrid, "reader")
    plain.service.search_context(hybrid, RequestContext("reader"))
    assert plain.service.search_calls_no_model(hybrid, "reader")
    assert not plain.service.search_calls_no_model(hybrid, "other")  # cached per subject
    assert not plain.service.search_calls_no_model(replace(hybrid, corpus="nope"), "reader")


def test_min_score_applies_to_the_rerank_score(world: World) -> None:
    everything = search(world, limit=10)
    strong = search(world, limit=10, min_score=0.5)
    assert strong == [(c, s) for c, s in everything if s >= 0.5]
    assert 0 < len(strong) < len(everything)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("duplicate-index", RerankFailedReason.DUPLICATE_INDEX),
        ("too-few", RerankFailedReason.WRONG_COUNT),
        ("nan", RerankFailedReason.NON_FINITE_SCORE),
        ("out-of-range", RerankFailedReason.INDEX_OUT_OF_RANGE),
    ],
)
def test_a_misbehaving_reranker_fails_the_search_with_its_reason(
    world: World, fake: FakeReranker, mode: str, reason: RerankFailedReason
) -> None:
    fake.set_mode(mode)  # type: ignore[arg-type]
    with pytest.raises(RetrievalError) as caught:
        search(world)
    assert caught.value.code is ErrorCode.RERANK_FAILED
    assert caught.value.reason == reason


def test_without_a_reranker_searches_are_not_reranked_and_asking_is_refused(
    harness: StoreHarness, local_embedding: LocalEmbedding, fake: FakeReranker
) -> None:
    world = build(harness, local_embedding, fake, reranker=False)
    assert search(world)  # the default: not reranked
    # Refused whatever the grant holds, an empty one too (not an empty success).
    for grant in (Grant("team", {"a": "r1"}), Grant("team", {})):
        world.authorizer.grants["search"] = grant
        with pytest.raises(RetrievalError) as caught:
            search(world, rerank=True)
        assert caught.value.code is ErrorCode.INVALID_REQUEST
        assert caught.value.reason == InvalidRequestReason.RERANK_UNAVAILABLE
    assert fake.requests == []


# --- the reranker is part of the corpus identity ---------------------------------------------


def _descriptor(service: RetrievalService) -> CorpusDescriptor:
    return service.corpus("docs").descriptor


def test_another_reranker_or_none_is_a_descriptor_mismatch(
    world: World, harness: StoreHarness, local_embedding: LocalEmbedding, fake: FakeReranker
) -> None:
    authorizer = Authorizer()
    for reranker, field_name in (
        (http_reranker(fake, model="rerank-multilingual-v3.0"), "reranking.model"),
        (None, "reranking"),
    ):
        with pytest.raises(RetrievalError) as caught:
            RetrievalService(
                [
                    Corpus(
                        "docs",
                        "passages-v1",
                        local_embedding,
                        harness.open(),
                        authorizer,
                        reranker=reranker,
                    )
                ]
            )
        assert caught.value.code is ErrorCode.DESCRIPTOR_MISMATCH
        assert field_name in caught.value.detail


def _store_descriptor_json(harness: StoreHarness, text: str) -> None:
    """Overwrite the stored descriptor of corpus `docs`, as another release wrote it."""
    if harness.kind == "sqlite":
        db = apsw.Connection(str(harness.location / "store.db"))
        try:
            db.execute("UPDATE corpora SET descriptor_json = ? WHERE corpus_id = 'docs'", (text,))
        finally:
            db.close()
        return
    with psycopg.connect(shared_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.corpora SET descriptor_json = %s WHERE corpus_id = 'docs'").format(
                sql.Identifier(schema_for(harness.location))
            ),
            (text,),
        )


def test_a_corpus_stored_before_reranking_opens_without_a_reranker_and_not_with_one(
    harness: StoreHarness, local_embedding: LocalEmbedding, fake: FakeReranker
) -> None:
    world = build(harness, local_embedding, fake, reranker=False)
    # What the previous main (b825519) stored: the same JSON without the `reranking` key.
    body = json.loads(_descriptor(world.service).canonical_json())
    del body["reranking"]
    _store_descriptor_json(harness, json.dumps(body, sort_keys=True, separators=(",", ":")))

    authorizer = Authorizer(grants={"search": Grant("team", {"a": "r1"})})
    reopened = RetrievalService(
        [Corpus("docs", "passages-v1", local_embedding, harness.open(), authorizer)]
    )
    result = reopened.search_context(SearchRequest("docs", QUERY), RequestContext("reader"))
    assert [h.chunk_id for h in result.hits][:1] == ["a-0"]
    with pytest.raises(RetrievalError) as caught:
        RetrievalService(
            [
                Corpus(
                    "docs",
                    "passages-v1",
                    local_embedding,
                    harness.open(),
                    authorizer,
                    reranker=http_reranker(fake),
                )
            ]
        )
    assert caught.value.code is ErrorCode.DESCRIPTOR_MISMATCH
    assert "reranking" in caught.value.detail

"""Search modes on the wire: `hybrid` by default, `dense` and `lexical` on request, each hit's
`scores` per ranking, and `minScore`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from retrieval_host.http.app import HostApp, create_app
from tests.support.host import CORPUS, World

pytestmark = pytest.mark.anyio
QUERY = "How do I rotate a token?"


@pytest.fixture
def app(http_world: World) -> HostApp:
    return create_app(http_world.settings(), http_world.driver)


@pytest.fixture
async def client(app: HostApp, http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {http_world.tokens['admin']}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="https://host.test", headers=headers
    ) as client:
        yield client


async def search(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await client.post(
        "/v1/retrieval/search", json={"corpus": CORPUS, "query": QUERY, **fields}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_hybrid_is_the_default_and_each_hit_shows_both_rankings(
    client: httpx.AsyncClient,
) -> None:
    default, hybrid = await search(client), await search(client, mode="hybrid")
    assert [h["chunkId"] for h in default["hits"]] == [h["chunkId"] for h in hybrid["hits"]]
    top = default["hits"][0]
    assert set(top["scores"]) == {"dense", "lexical", "rerank"}
    assert top["scores"]["dense"] is not None and top["scores"]["lexical"] is not None
    assert top["scores"]["rerank"] is None  # this corpus has no reranker
    assert 0.0 <= top["score"] <= 1.0  # the convex fusion of two min-max scaled rankings

    dense = await search(client, mode="dense")
    assert all(h["scores"]["lexical"] is None for h in dense["hits"])
    assert all(h["score"] == h["scores"]["dense"] for h in dense["hits"])
    lexical = await search(client, mode="lexical")
    assert all(h["scores"]["dense"] is None for h in lexical["hits"])
    assert all(h["score"] == h["scores"]["lexical"] > 0 for h in lexical["hits"])


async def test_min_score_leaves_out_weak_hits_without_calling_them_truncated(
    client: httpx.AsyncClient,
) -> None:
    every = await search(client, mode="dense", limit=100)
    scores = sorted(h["score"] for h in every["hits"])
    assert len(scores) >= 2 and scores[0] < scores[-1]
    middle = (scores[0] + scores[-1]) / 2
    strong = await search(client, mode="dense", limit=100, minScore=middle)
    assert strong["hits"] and all(h["score"] >= middle for h in strong["hits"])
    assert len(strong["hits"]) == sum(1 for s in scores if s >= middle)
    assert strong["truncated"] is False
    none = await search(client, mode="dense", minScore=2.0)  # above any cosine similarity
    assert (none["hits"], none["truncated"]) == ([], False)


@pytest.mark.parametrize(
    "fields", [{"mode": "semantic"}, {"mode": None}, {"minScore": "high"}, {"minScore": [1]}]
)
async def test_a_mode_or_min_score_the_schema_refuses_is_a_typed_422(
    client: httpx.AsyncClient, fields: dict[str, Any]
) -> None:
    response = await client.post(
        "/v1/retrieval/search", json={"corpus": CORPUS, "query": QUERY, **fields}
    )
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "INVALID_REQUEST"

"""The inspection routes in process: what a token's subject may see, paged, and the one 404."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.inspection import Cursor, decode_cursor, encode_cursor
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.http.app import HostApp, create_app
from tests.support.host import CORPUS, HANDBOOK, World

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    app: HostApp = create_app(http_world.settings(), http_world.driver)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


def _auth(world: World, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[name]}"}


def _problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert (body["code"], body["status"]) == (code, status)
    return body


def _without_request_id(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "requestId"}


async def test_corpora_lists_what_each_token_may_search_with_its_operations(
    client: httpx.AsyncClient, http_world: World
) -> None:
    alice = await client.get("/v1/corpora", headers=_auth(http_world, "alice"))
    assert alice.status_code == 200, alice.text
    [corpus] = alice.json()["corpora"]
    assert corpus["id"] == CORPUS
    assert corpus["operations"] == ["search", "index", "delete"]
    assert (corpus["sources"], corpus["passages"]) == (1, len(HANDBOOK))  # not "secret"
    assert corpus["bytes"] == sum(len(t.encode()) for t in HANDBOOK)
    assert set(corpus["embedding"]) == {"providerId", "vendor", "model", "dimensions", "metric"}
    admin = (await client.get("/v1/corpora", headers=_auth(http_world, "admin"))).json()
    assert [(c["id"], c["sources"], c["operations"]) for c in admin["corpora"]] == [
        (CORPUS, 2, ["search", "index", "delete"])
    ]
    assert "writeOnly" in admin and admin["writeOnly"] == []
    bob = await client.get("/v1/corpora", headers=_auth(http_world, "bob"))
    assert bob.json() == {"corpora": [], "writeOnly": []}
    _problem(await client.get("/v1/corpora"), 401, "UNAUTHENTICATED")


async def test_a_token_that_may_only_write_learns_which_corpora_and_nothing_more(
    http_world: World,
) -> None:
    """`GET /v1/corpora` lists searchable corpora; a token that may only index (an
    application's writer) was told nothing, so the console said it could not ingest."""
    writer = "writer-token-0123456789abcdef"
    tokens = {"writer": writer}
    entry = {
        "subject": "alice",
        "sha256": hashlib.sha256(writer.encode()).hexdigest(),
        "retrieval": {"search": [], "index": [CORPUS, "atlantis"], "delete": [CORPUS]},
    }
    settings = http_world.settings(tokens=[*http_world.token_entries, entry])
    app = create_app(settings, http_world.driver)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        answer = await client.get(
            "/v1/corpora", headers={"Authorization": f"Bearer {tokens['writer']}"}
        )
    assert answer.status_code == 200, answer.text
    # No counts for what it may not search; "atlantis" is no corpus of this host.
    assert answer.json() == {
        "corpora": [],
        "writeOnly": [{"id": CORPUS, "operations": ["index", "delete"]}],
    }

    # Granted search too, but the application denies its subject: still a writer there.
    stranger = "stranger-token-0123456789abcdef"
    denied = {
        "subject": "stranger",
        "sha256": hashlib.sha256(stranger.encode()).hexdigest(),
        "retrieval": {"search": [CORPUS], "index": [CORPUS], "delete": []},
    }
    settings = http_world.settings(tokens=[*http_world.token_entries, denied])
    transport = httpx.ASGITransport(app=create_app(settings, http_world.driver))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        answer = await client.get("/v1/corpora", headers={"Authorization": f"Bearer {stranger}"})
    assert answer.json() == {"corpora": [], "writeOnly": [{"id": CORPUS, "operations": ["index"]}]}


async def test_sources_page_by_cursor_over_authorized_sources(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world, "admin")
    first = await client.get(f"/v1/corpora/{CORPUS}/sources?limit=1", headers=auth)
    assert first.status_code == 200, first.text
    [handbook] = first.json()["sources"]
    indexed_at = handbook.pop("indexedAt")
    assert isinstance(indexed_at, str) and indexed_at.endswith("Z")
    assert handbook == {
        "id": "handbook",
        "revision": "r1",
        "title": "The handbook",
        "mediaType": None,
        "metadata": {},
        "chunkCount": len(HANDBOOK),
        "bytes": sum(len(t.encode()) for t in HANDBOOK),
    }
    cursor = first.json()["nextCursor"]
    second = await client.get(
        f"/v1/corpora/{CORPUS}/sources", params={"limit": 1, "cursor": cursor}, headers=auth
    )
    assert [s["id"] for s in second.json()["sources"]] == ["secret"]
    assert second.json()["nextCursor"] is None
    alice = await client.get(f"/v1/corpora/{CORPUS}/sources", headers=_auth(http_world, "alice"))
    assert [s["id"] for s in alice.json()["sources"]] == ["handbook"]


async def test_bad_limits_and_cursors_are_typed_400s(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world, "admin")
    url = f"/v1/corpora/{CORPUS}/sources"
    for limit in ("0", "1001", "abc", "-1", "1.5"):
        body = _problem(
            await client.get(url, params={"limit": limit}, headers=auth), 400, "INVALID_REQUEST"
        )
        assert body["reason"] == "page-limit"
    cursor = (await client.get(url, params={"limit": 1}, headers=auth)).json()["nextCursor"]
    flip = "0" if cursor[5] != "0" else "1"
    for bad in (cursor[:5] + flip + cursor[6:], "00", "zz"):
        response = await client.get(url, params={"cursor": bad}, headers=auth)
        assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "invalid-cursor", bad
    source_url = f"/v1/corpora/{CORPUS}/sources/handbook"
    response = await client.get(source_url, params={"cursor": cursor}, headers=auth)
    assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "invalid-cursor"
    # The format is public (only checksummed): a position past the stores' 64-bit ordinals,
    # forged, was a 500 (probe A, session 37).
    revision = (await client.get(source_url, headers=auth)).json()["source"]["revision"]
    for after in (2**63, 10**30, -1):
        forged = encode_cursor(Cursor("passages", CORPUS, after, "handbook", revision))
        response = await client.get(source_url, params={"cursor": forged}, headers=auth)
        assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "invalid-cursor", after
    # A passage cursor names the content it was read from: taken from a real one.
    real = (await client.get(source_url, params={"limit": 1}, headers=auth)).json()["nextCursor"]
    content = decode_cursor(real, "passages", CORPUS, "handbook").content
    last = encode_cursor(Cursor("passages", CORPUS, 2**63 - 1, "handbook", revision, content))
    response = await client.get(source_url, params={"cursor": last}, headers=auth)
    assert response.status_code == 200 and response.json()["passages"] == []
    _problem(await client.get(url, params={"other": "1"}, headers=auth), 422, "INVALID_REQUEST")


async def test_a_source_shows_its_passages_and_an_unauthorized_one_is_a_missing_one(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world, "alice")
    shown = await client.get(f"/v1/corpora/{CORPUS}/sources/handbook?limit=2", headers=auth)
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["source"]["revision"] == "r1"
    assert [p["chunkId"] for p in body["passages"]] == ["handbook-0", "handbook-1"]
    assert body["passages"][1]["location"]["startLine"] == 2
    assert body["passages"][1]["bytes"] == len(HANDBOOK[1].encode())
    rest = await client.get(
        f"/v1/corpora/{CORPUS}/sources/handbook",
        params={"limit": 2, "cursor": body["nextCursor"]},
        headers=auth,
    )
    assert [p["chunkId"] for p in rest.json()["passages"]] == ["handbook-2"]

    unauthorized = await client.get(f"/v1/corpora/{CORPUS}/sources/secret", headers=auth)
    missing = await client.get(f"/v1/corpora/{CORPUS}/sources/nowhere", headers=auth)
    passage_unauthorized = await client.get(f"/v1/corpora/{CORPUS}/passages/secret-0", headers=auth)
    passage_missing = await client.get(f"/v1/corpora/{CORPUS}/passages/nowhere", headers=auth)
    bodies = [
        _without_request_id(_problem(r, 404, "SOURCE_UNAVAILABLE"))
        for r in (unauthorized, missing, passage_unauthorized, passage_missing)
    ]
    assert all(b == bodies[0] for b in bodies)


async def test_a_passage_reads_like_a_hit_and_the_token_grant_comes_first(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world, "alice")
    read = await client.get(f"/v1/corpora/{CORPUS}/passages/handbook-1", headers=auth)
    assert read.status_code == 200, read.text
    passage = read.json()
    assert passage["text"] == HANDBOOK[1]
    assert passage["source"] == {"id": "handbook", "revision": "r1"}
    assert passage["scope"] == {
        "corpus": CORPUS,
        "indexVersion": "passages-v1",
        "namespace": "team",
    }
    assert passage["retrievedAt"].endswith("Z")
    for path in ("sources", "sources/handbook", "passages/handbook-1"):
        bob = await client.get(f"/v1/corpora/{CORPUS}/{path}", headers=_auth(http_world, "bob"))
        _problem(bob, 403, "PERMISSION_DENIED")
        ghost = await client.get(f"/v1/corpora/atlantis/{path}", headers=_auth(http_world, "ghost"))
        _problem(ghost, 403, "PERMISSION_DENIED")


async def test_an_ingested_document_lists_its_media_type_and_ids_may_hold_slashes(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world, "admin")
    source_id = "notes/2026/today.md"
    ingested = await client.post(
        "/v1/retrieval/ingest",
        params={"corpus": CORPUS, "sourceId": source_id},
        content=b"# Today\n\nOtters were seen near the weir.\n",
        headers={**auth, "Content-Type": "text/markdown; charset=utf-8"},
    )
    assert ingested.status_code == 200, ingested.text
    revision = ingested.json()["source"]["revision"]
    for path in (f"sources/{source_id}", "sources/notes%2F2026%2Ftoday.md"):
        shown = await client.get(f"/v1/corpora/{CORPUS}/{path}", headers=auth)
        assert shown.status_code == 200, shown.text
        source = shown.json()["source"]
        assert (source["id"], source["revision"], source["mediaType"]) == (
            source_id,
            revision,
            "text/markdown",
        )
    chunk_id = shown.json()["passages"][0]["chunkId"]
    passage = await client.get(f"/v1/corpora/{CORPUS}/passages/{chunk_id}", headers=auth)
    assert passage.status_code == 200, passage.text
    assert "Otters" in passage.json()["text"]
    delete = {"corpus": CORPUS, "sourceId": source_id, "revision": revision}
    assert (await client.post("/v1/retrieval/delete", json=delete, headers=auth)).status_code == 200


async def test_a_corpus_whose_id_holds_a_slash_is_one_escaped_segment(
    http_world: World, local_embedding: LocalEmbedding, tmp_path: Path
) -> None:
    # A black-box test: corpus ids may hold `/`, and `/v1/corpora/team%2Fa/sources` (how the
    # client and the console escape one) was unescaped before routing: no such route.
    store = SqliteVectorStore.open(tmp_path / "team.sqlite")

    def everyone(request: AuthorizationRequest, context: RequestContext) -> Grant:
        if request.operation == "search":
            return Grant("ns", {"notes/q3": "r1"})
        return Grant("ns", {sid: ANY_REVISION for sid in request.source_ids or ()})

    corpus = Corpus("team/a", "passages-v1", local_embedding, store, everyone)
    driver = Driver(RetrievalService([corpus], query_cache_entries=0))
    chunk = ChunkInput("notes/q3-1", "The third quarter closed early.", Location(start_line=1))
    driver.index_context(
        IndexRequest("team/a", SourceInfo("notes/q3", "r1"), [chunk]), RequestContext("w")
    )
    token = "team-token-0123456789abcdef"
    entry = {
        "subject": "reader",
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "retrieval": {"search": ["team/a"]},
    }
    app = create_app(http_world.settings(tokens=[entry]), driver)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="https://host.test"
        ) as client:
            listed = await client.get("/v1/corpora/team%2Fa/sources?limit=5", headers=headers)
            assert listed.status_code == 200, listed.text
            assert [s["id"] for s in listed.json()["sources"]] == ["notes/q3"]
            source = await client.get("/v1/corpora/team%2Fa/sources/notes%2Fq3", headers=headers)
            assert source.status_code == 200, source.text
            passage = await client.get("/v1/corpora/team%2Fa/passages/notes/q3-1", headers=headers)
            assert passage.json()["text"] == chunk.text
            # Unescaped, the path names corpus `team`, which this host does not have.
            _problem(
                await client.get("/v1/corpora/team/a/sources", headers=headers),
                404,
                "INVALID_REQUEST",
            )
    finally:
        store.close()

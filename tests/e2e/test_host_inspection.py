"""Inspection over real HTTPS (uvicorn, TLS from trustme): list, inspect, navigate a citation,
and the one 404 for a missing and an unauthorized source or passage."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.core.test_inspection_cursor import signed_cursor
from tests.support.host import CORPUS, HANDBOOK, RunningHost, World


def _bearer(world: World, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[name]}"}


def _without_request_id(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "requestId"}


def test_list_inspect_and_navigate_a_citation(running_host: RunningHost, host_world: World) -> None:
    auth = _bearer(host_world, "alice")
    with running_host.client(headers=auth) as client:
        corpora = client.get("/v1/corpora")
        sources = client.get(f"/v1/corpora/{CORPUS}/sources", params={"limit": 10})
        source = client.get(f"/v1/corpora/{CORPUS}/sources/handbook", params={"limit": 1})
        rest = client.get(
            f"/v1/corpora/{CORPUS}/sources/handbook",
            params={"limit": 1000, "cursor": source.json()["nextCursor"]},
        )
        hit = client.post(
            "/v1/retrieval/search", json={"corpus": CORPUS, "query": "How do I rotate a token?"}
        ).json()["hits"][0]
        passage = client.get(f"/v1/corpora/{CORPUS}/passages/{hit['chunkId']}")
    assert corpora.status_code == 200, corpora.text
    assert [(c["id"], c["sources"]) for c in corpora.json()["corpora"]] == [(CORPUS, 1)]
    assert [(s["id"], s["revision"]) for s in sources.json()["sources"]] == [("handbook", "r1")]
    assert sources.json()["nextCursor"] is None
    assert [p["chunkId"] for p in source.json()["passages"]] == ["handbook-0"]
    assert [p["chunkId"] for p in rest.json()["passages"]] == ["handbook-1", "handbook-2"]
    assert passage.status_code == 200, passage.text
    cited = passage.json()
    assert (cited["text"], cited["source"], cited["location"]) == (
        hit["text"],
        hit["source"],
        hit["location"],
    )
    assert cited["text"] in HANDBOOK


def test_a_missing_and_an_unauthorized_source_or_passage_are_one_404(
    running_host: RunningHost, host_world: World
) -> None:
    with running_host.client(headers=_bearer(host_world, "alice")) as client:
        answers = [
            client.get(f"/v1/corpora/{CORPUS}/sources/secret"),
            client.get(f"/v1/corpora/{CORPUS}/sources/nowhere"),
            client.get(f"/v1/corpora/{CORPUS}/passages/secret-0"),
            client.get(f"/v1/corpora/{CORPUS}/passages/nowhere"),
        ]
        listed = client.get(f"/v1/corpora/{CORPUS}/sources").json()["sources"]
    bodies = [_without_request_id(r.json()) for r in answers]
    assert {r.status_code for r in answers} == {404}
    assert all(body == bodies[0] for body in bodies)
    assert bodies[0]["code"] == "SOURCE_UNAVAILABLE"
    assert "secret" not in {s["id"] for s in listed}


def test_inspection_needs_the_token_search_grant(
    running_host: RunningHost, host_world: World
) -> None:
    with running_host.client() as client:
        anonymous = client.get("/v1/corpora")
        bob = client.get(f"/v1/corpora/{CORPUS}/sources", headers=_bearer(host_world, "bob"))
        bob_corpora = client.get("/v1/corpora", headers=_bearer(host_world, "bob"))
    assert anonymous.status_code == 401
    assert bob.status_code == 403
    assert bob_corpora.json() == {"corpora": [], "writeOnly": []}


def test_a_passage_cursor_of_a_label_written_again_is_a_409_not_other_passages(
    running_host: RunningHost, host_world: World
) -> None:
    # Probe A, session 39: r1, r2, then r1 again with other passages, and page 1's cursor
    # went on with page 2 of the new r1 (200): one listing of two writes.
    url = f"/v1/corpora/{CORPUS}/sources/relabel"

    def index(client: httpx.Client, revision: str, tag: str) -> None:
        chunks = [{"id": f"relabel-{tag}-{i}", "text": f"Relabel {tag} {i}."} for i in range(4)]
        source = {"id": "relabel", "revision": revision}
        body = {"corpus": CORPUS, "source": source, "chunks": chunks}
        response = client.post("/v1/retrieval/index", json=body)
        assert response.status_code == 200, response.text

    with running_host.client(headers=_bearer(host_world, "admin")) as client:
        try:
            index(client, "r1", "A")
            first = client.get(url, params={"limit": 2}).json()
            index(client, "r2", "X")
            index(client, "r1", "B")
            stale = client.get(url, params={"limit": 2, "cursor": first["nextCursor"]})
            fresh = client.get(url, params={"limit": 2}).json()
        finally:
            gone = {"corpus": CORPUS, "sourceId": "relabel", "revision": "r1"}
            client.post("/v1/retrieval/delete", json=gone)
    assert [p["chunkId"] for p in first["passages"]] == ["relabel-A-0", "relabel-A-1"]
    assert stale.status_code == 409, stale.text
    assert (stale.json()["code"], stale.json()["reason"]) == ("SOURCE_CONFLICT", "revision-changed")
    assert [p["chunkId"] for p in fresh["passages"]] == ["relabel-B-0", "relabel-B-1"]


def test_a_forged_cursor_holding_a_lone_surrogate_is_a_400_not_a_500(
    running_host: RunningHost, host_world: World
) -> None:
    # Probe A, session 39: JSON escapes spell a lone surrogate in a valid UTF-8 payload, and
    # the store could not encode it (500 INTERNAL). `json.dumps` writes it as `\ud800`.
    sources = signed_cursor(json.dumps(["sources", CORPUS, "\ud800", None, None]))
    passages = signed_cursor(json.dumps(["passages", CORPUS, 0, "handbook", "r1\udfff", "1"]))
    with running_host.client(headers=_bearer(host_world, "alice")) as client:
        answers = [
            client.get(f"/v1/corpora/{CORPUS}/sources", params={"cursor": sources}),
            client.get(f"/v1/corpora/{CORPUS}/sources/handbook", params={"cursor": passages}),
        ]
    for response in answers:
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert (response.json()["code"], response.json()["reason"]) == (
            "INVALID_REQUEST",
            "invalid-cursor",
        )

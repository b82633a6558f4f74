"""The routes in process (httpx.ASGITransport): shapes, strict validation and the full cycle."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from retrieval_host.driver import Driver
from retrieval_host.http import routes as routes_module
from retrieval_host.http.app import HostApp, create_app
from tests.support.host import CORPUS, World

pytestmark = pytest.mark.anyio

SAMPLES = Path(__file__).resolve().parents[2] / "server" / "retrieval_host" / "samples"


@pytest.fixture
def app(http_world: World) -> HostApp:
    return create_app(http_world.settings(), http_world.driver)


@pytest.fixture
async def client(app: HostApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


def _auth(world: World, name: str = "admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[name]}"}


def _problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert body["status"] == status
    assert body["requestId"] == response.headers["x-request-id"]
    return body


async def test_index_search_delete_round_trip_with_prepared_passages(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world)
    index = {
        "corpus": CORPUS,
        "source": {"id": "faq", "revision": "v1", "title": "FAQ", "metadata": {"lang": "en"}},
        "chunks": [
            {
                "id": "faq-1",
                "text": "Readiness turns green when every store answers and the model is loaded.",
                "location": {"page": 2, "startLine": 4, "endLine": 6},
            }
        ],
    }
    indexed = await client.post("/v1/retrieval/index", json=index, headers=auth)
    assert indexed.status_code == 200, indexed.text
    assert indexed.json()["status"] == "indexed"
    assert indexed.json()["usage"]["embedding"]["requests"] == 1
    again = await client.post("/v1/retrieval/index", json=index, headers=auth)
    assert again.json()["status"] == "unchanged"
    assert again.json()["usage"]["embedding"]["requests"] == 0
    assert http_world.registry.current(CORPUS, "team")["faq"] == "v1"

    search = {"corpus": CORPUS, "query": "when is the host ready?", "filters": {"lang": "en"}}
    found = await client.post("/v1/retrieval/search", json=search, headers=auth)
    assert found.status_code == 200, found.text
    hit = found.json()["hits"][0]
    assert hit["chunkId"] == "faq-1"
    assert hit["location"] == {"page": 2, "startLine": 4, "endLine": 6, "documentId": None}
    assert hit["scope"] == {"corpus": CORPUS, "indexVersion": "passages-v1", "namespace": "team"}
    assert -1.0 <= hit["score"] <= 1.0

    delete = {"corpus": CORPUS, "sourceId": "faq", "revision": "v1"}
    deleted = await client.post("/v1/retrieval/delete", json=delete, headers=auth)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["deletedChunks"] == 1
    gone = await client.post(
        "/v1/retrieval/search", json={**search, "sourceIds": ["faq"]}, headers=auth
    )
    _problem(gone, 404, "SOURCE_UNAVAILABLE")
    assert "faq" not in http_world.registry.current(CORPUS, "team")


async def test_a_delete_naming_a_replaced_revision_answers_409_stale_revision(
    client: httpx.AsyncClient, http_world: World
) -> None:
    """The example application grants a delete at the store's current revision: a delete of
    an older one answered 404, as for a source never stored (a black-box test), where the
    writer needs to tell "replaced: fetch the revision and retry" from "gone"."""
    auth = _auth(http_world)
    for revision in ("v1", "v2"):
        index = {
            "corpus": CORPUS,
            "source": {"id": "stale-del", "revision": revision, "title": "Stale"},
            "chunks": [{"id": f"stale-del-{revision}", "text": f"Kettle notes, {revision}."}],
        }
        indexed = await client.post("/v1/retrieval/index", json=index, headers=auth)
        assert indexed.status_code == 200, indexed.text

    def delete(source_id: str, revision: str) -> dict[str, str]:
        return {"corpus": CORPUS, "sourceId": source_id, "revision": revision}

    stale = await client.post("/v1/retrieval/delete", json=delete("stale-del", "v1"), headers=auth)
    assert _problem(stale, 409, "SOURCE_CONFLICT")["reason"] == "stale-revision"
    # A subject that may delete a source it may not search learns that it is stored, not at
    # which revision.
    hidden = await client.post(
        "/v1/retrieval/delete", json=delete("secret", "r0"), headers=_auth(http_world, "alice")
    )
    assert _problem(hidden, 409, "SOURCE_CONFLICT")["reason"] == "stale-revision"
    assert "r1" not in hidden.text

    deleted = await client.post(
        "/v1/retrieval/delete", json=delete("stale-del", "v2"), headers=auth
    )
    assert deleted.status_code == 200, deleted.text
    gone = await client.post("/v1/retrieval/delete", json=delete("stale-del", "v1"), headers=auth)
    never = await client.post("/v1/retrieval/delete", json=delete("never-was", "v1"), headers=auth)
    gone_body = _problem(gone, 404, "SOURCE_UNAVAILABLE")
    never_body = _problem(never, 404, "SOURCE_UNAVAILABLE")
    assert {**gone_body, "requestId": ""} == {**never_body, "requestId": ""}


async def test_ingest_takes_the_raw_document_with_its_content_type(
    client: httpx.AsyncClient, http_world: World
) -> None:
    response = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=thread&title=Reindexing",
        content=(SAMPLES / "reindex-thread.mbox").read_bytes(),
        headers={**_auth(http_world), "Content-Type": "application/mbox"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["source"]["id"] == "thread"
    assert body["chunkCount"] >= 2
    found = await client.post(
        "/v1/retrieval/search",
        json={"corpus": CORPUS, "query": "reindex", "sourceIds": ["thread"]},
        headers=_auth(http_world),
    )
    assert found.status_code == 200
    assert all(h["location"]["documentId"] for h in found.json()["hits"])


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"corpus": CORPUS, "query": "q", "source_ids": ["a"]}, 422),  # snake_case is not wire
        ({"corpus": CORPUS, "query": "q", "unknown": 1}, 422),
        ({"corpus": CORPUS, "query": "q", "limit": "5"}, 422),  # no string coercion
        ({"corpus": CORPUS, "query": "q", "limit": True}, 422),
        ({"corpus": CORPUS, "query": "q", "limit": 5.5}, 422),
        ({"corpus": CORPUS, "query": "   "}, 422),
        ({"corpus": " padded", "query": "q"}, 422),
        ({"query": "q"}, 422),
    ],
)
async def test_request_bodies_are_validated_strictly(
    client: httpx.AsyncClient, http_world: World, body: dict[str, Any], status: int
) -> None:
    response = await client.post("/v1/retrieval/search", json=body, headers=_auth(http_world))
    problem = _problem(response, status, "INVALID_REQUEST")
    assert problem["detail"].startswith("body")
    assert "padded" not in problem["detail"]  # locations and messages, never input values


async def test_an_integral_float_is_an_integer_as_in_json_schema(
    client: httpx.AsyncClient, http_world: World
) -> None:
    response = await client.post(
        "/v1/retrieval/search",
        json={"corpus": CORPUS, "query": "tokens", "limit": 2.0},
        headers=_auth(http_world),
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["hits"]) <= 2


async def test_malformed_json_is_400_and_a_wrong_content_type_is_415(
    client: httpx.AsyncClient, http_world: World
) -> None:
    auth = _auth(http_world)
    broken = await client.post(
        "/v1/retrieval/search",
        content=b'{"corpus": ',
        headers={**auth, "Content-Type": "application/json"},
    )
    _problem(broken, 400, "INVALID_REQUEST")
    form = await client.post("/v1/retrieval/search", data={"corpus": CORPUS}, headers=auth)
    _problem(form, 415, "UNSUPPORTED_MEDIA_TYPE")
    untyped = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=x",
        content=b"%PDF-1.7",
        headers={**auth, "Content-Type": "application/octet-stream"},
    )
    _problem(untyped, 415, "UNSUPPORTED_MEDIA_TYPE")


async def test_ingest_query_parameters_are_strict_and_the_grant_comes_first(
    client: httpx.AsyncClient, http_world: World
) -> None:
    markdown = {"Content-Type": "text/markdown"}
    unknown = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=x&colour=blue",
        content=b"# x\n\ntext\n",
        headers={**_auth(http_world), **markdown},
    )
    _problem(unknown, 422, "INVALID_REQUEST")
    missing = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}",
        content=b"# x",
        headers={**_auth(http_world), **markdown},
    )
    _problem(missing, 422, "INVALID_REQUEST")
    for idle in ("-5", "0"):
        negative = await client.post(
            f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=x&idleTimeoutMs={idle}",
            content=b"# x\n\ntext\n",
            headers={**_auth(http_world), **markdown},
        )
        _problem(negative, 422, "INVALID_REQUEST")
        assert "greater than or equal to 1" in negative.json()["detail"], negative.json()
    # No grant: refused before the body's type is even looked at.
    denied = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=x",
        content=b"\x00\x01",
        headers={**_auth(http_world, "bob"), "Content-Type": "image/png"},
    )
    _problem(denied, 403, "PERMISSION_DENIED")


async def test_unknown_routes_and_methods_are_problems_too(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v2/anything")
    _problem(missing, 404, "INVALID_REQUEST")
    wrong_method = await client.get("/v1/retrieval/search")
    _problem(wrong_method, 405, "INVALID_REQUEST")
    assert wrong_method.headers["allow"] == "POST"


async def test_without_a_retrieval_service_the_host_only_describes_itself(
    http_world: World,
) -> None:
    app = create_app(http_world.settings(), None)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="https://host.test"
    ) as client:
        protocol = await client.get("/v1/protocol")
        search = await client.post(
            "/v1/retrieval/search", json={"corpus": CORPUS, "query": "q"}, headers=_auth(http_world)
        )
        openapi = await client.get("/v1/openapi.json")
    assert protocol.json()["capabilities"] == []
    assert search.status_code == 404
    assert set(openapi.json()["paths"]) == {
        "/v1/protocol",
        "/v1/openapi.json",
        "/healthz",
        "/readyz",
        "/metrics",  # served before the routes, with or without a retrieval service
    }


async def test_readiness_is_unavailable_when_a_store_does_not_answer_in_time(
    app: HostApp, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box test: with PostgreSQL frozen, `/readyz` took 20-30 s to answer.
    app.routes.started = True
    assert (await client.get("/readyz")).status_code == 200
    release = threading.Event()
    monkeypatch.setattr(routes_module, "READY_PROBE_S", 0.2)
    monkeypatch.setattr(Driver, "stores_answer", lambda self: release.wait(60))
    try:
        response = await client.get("/readyz")
    finally:
        release.set()
    assert response.status_code == 503
    assert response.json()["checks"] == {"started": True, "stores": False}

"""Discovery, tokens and grants over real HTTPS (uvicorn, TLS from trustme)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.host import CORPUS, RunningHost, World

SEARCH = {"corpus": CORPUS, "query": "How do I rotate a token?"}


def _bearer(world: World, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[name]}"}


def _without_request_id(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "requestId"}


def test_discovery_needs_no_token(running_host: RunningHost) -> None:
    with running_host.client() as client:
        protocol = client.get("/v1/protocol")
        openapi = client.get("/v1/openapi.json")
        health = client.get("/healthz")
        ready = client.get("/readyz")
    assert protocol.status_code == 200
    info = protocol.json()
    assert info["name"] == "retrieval-host"
    assert info["version"] == "1"
    assert set(info["capabilities"]) == {"scoped-retrieval", "retrieval-indexing"}
    assert info["auth"]["scheme"] == "bearer"
    assert info["limits"]["maxBodyBytes"] == 256 * 1024
    assert "application/pdf" in info["limits"]["ingestMediaTypes"]
    assert openapi.status_code == 200
    assert openapi.json()["openapi"].startswith("3.1")
    assert health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


def test_every_response_carries_its_request_id(running_host: RunningHost) -> None:
    with running_host.client() as client:
        first = client.post("/v1/retrieval/search", json=SEARCH)
        second = client.post("/v1/retrieval/search", json=SEARCH)
    assert first.headers["x-request-id"] == first.json()["requestId"]
    assert len(first.headers["x-request-id"]) == 32
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer rh_wrong"}, {"Authorization": "Basic YWxhZGRpbjpzZXNhbWU="}],
    ids=["missing", "wrong", "other-scheme"],
)
def test_missing_or_wrong_token_is_401(running_host: RunningHost, headers: dict[str, str]) -> None:
    with running_host.client() as client:
        response = client.post("/v1/retrieval/search", json=SEARCH, headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    body = response.json()
    assert body["code"] == "UNAUTHENTICATED"
    assert body["status"] == 401
    assert set(body) >= {"type", "title", "status", "code", "detail", "requestId"}


@pytest.mark.parametrize("name", ["access_token", "token", "api_key", "q"])
def test_a_token_in_the_query_string_is_refused_even_with_a_valid_header(
    running_host: RunningHost, host_world: World, name: str
) -> None:
    token = host_world.tokens["alice"]
    with running_host.client() as client:
        response = client.post(
            f"/v1/retrieval/search?{name}={token}",
            json=SEARCH,
            headers=_bearer(host_world, "alice"),
        )
    assert response.status_code == 401
    assert response.json()["reason"] == "token-in-query"


def test_a_valid_token_with_its_grant_searches(
    running_host: RunningHost, host_world: World
) -> None:
    with running_host.client() as client:
        response = client.post(
            "/v1/retrieval/search", json=SEARCH, headers=_bearer(host_world, "alice")
        )
    assert response.status_code == 200
    hits = response.json()["hits"]
    assert hits[0]["source"] == {"id": "handbook", "revision": "r1"}
    assert "rotate a token" in hits[0]["text"]
    assert {h["source"]["id"] for h in hits} == {"handbook"}  # `secret` is not alice's


def test_a_missing_grant_and_a_nonexistent_corpus_give_the_same_403(
    running_host: RunningHost, host_world: World
) -> None:
    with running_host.client() as client:
        no_grant = client.post(
            "/v1/retrieval/search", json=SEARCH, headers=_bearer(host_world, "bob")
        )
        granted_but_missing = client.post(
            "/v1/retrieval/search",
            json={**SEARCH, "corpus": "atlantis"},
            headers=_bearer(host_world, "ghost"),
        )
        delete_no_grant = client.post(
            "/v1/retrieval/delete",
            json={"corpus": CORPUS, "sourceId": "handbook", "revision": "r1"},
            headers=_bearer(host_world, "bob"),
        )
    assert no_grant.status_code == granted_but_missing.status_code == 403
    assert no_grant.json()["code"] == "PERMISSION_DENIED"
    assert _without_request_id(no_grant.json()) == _without_request_id(granted_but_missing.json())
    assert _without_request_id(no_grant.json()) == _without_request_id(delete_no_grant.json())


def test_an_unauthorized_and_a_nonexistent_source_are_indistinguishable(
    running_host: RunningHost, host_world: World
) -> None:
    with running_host.client() as client:
        unauthorized = client.post(
            "/v1/retrieval/search",
            json={**SEARCH, "sourceIds": ["secret"]},  # exists, but not alice's
            headers=_bearer(host_world, "alice"),
        )
        missing = client.post(
            "/v1/retrieval/search",
            json={**SEARCH, "sourceIds": ["no-such-source"]},
            headers=_bearer(host_world, "alice"),
        )
    assert unauthorized.status_code == missing.status_code == 404
    assert unauthorized.json()["code"] == "SOURCE_UNAVAILABLE"
    assert unauthorized.headers["content-type"] == missing.headers["content-type"]
    assert _without_request_id(unauthorized.json()) == _without_request_id(missing.json())


def test_an_unexpected_failure_is_internal_and_discloses_nothing(
    running_host: RunningHost, host_world: World, caplog: pytest.LogCaptureFixture
) -> None:
    with running_host.client() as client:
        response = client.post(
            "/v1/retrieval/search", json=SEARCH, headers=_bearer(host_world, "boom")
        )
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == "INTERNAL"
    assert "hunter2" not in response.text
    assert "RuntimeError" not in response.text
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == body["requestId"]]
    assert len(logged) == 1, "the failure is logged once, under the request id"
    assert logged[0].exc_info is not None

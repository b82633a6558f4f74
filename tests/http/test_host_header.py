"""The Host header never shapes an answer: no redirects, and an optional allow-list of hosts."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from retrieval_host.http.app import create_app
from retrieval_host.settings import HostSettings
from tests.support.host import CORPUS, World

pytestmark = pytest.mark.anyio


def _client(settings: HostSettings, world: World) -> httpx.AsyncClient:
    app = create_app(settings, world.driver)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="https://host.test", follow_redirects=False
    )


def _problem(response: httpx.Response, status: int, code: str, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "location" not in response.headers
    body: dict[str, Any] = response.json()
    assert (body["code"], body["reason"]) == (code, reason)
    return body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/retrieval/search/"),
        ("GET", "/v1/protocol/"),
        ("GET", "/healthz/"),
        ("POST", "/v1/runs/"),
        ("GET", "/v1/openapi.json/"),
        # Empty ids of the inspection routes: a 422 of the id rule before (a black-box test).
        ("GET", f"/v1/corpora/{CORPUS}/sources/"),
        ("GET", f"/v1/corpora/{CORPUS}/passages/"),
    ],
)
async def test_a_trailing_slash_is_an_unknown_route_not_a_redirect_to_the_callers_host(
    http_world: World, method: str, path: str
) -> None:
    async with _client(http_world.settings(), http_world) as client:
        response = await client.request(
            method, path, headers={"Host": "evil.example"}, json={"corpus": CORPUS, "query": "q"}
        )
    _problem(response, 404, "INVALID_REQUEST", "route")
    assert b"evil.example" not in response.content


async def test_without_an_allow_list_any_host_is_served(http_world: World) -> None:
    async with _client(http_world.settings(), http_world) as client:
        response = await client.get("/v1/protocol", headers={"Host": "anything.example"})
    assert response.status_code == 200


async def test_an_allow_list_refuses_other_hosts_with_a_problem_before_authentication(
    http_world: World,
) -> None:
    settings = http_world.settings(allowedHosts=["retrieval.example", "127.0.0.1"])
    token = {"Authorization": f"Bearer {http_world.tokens['admin']}"}
    async with _client(settings, http_world) as client:
        listed = await client.get("/v1/protocol", headers={"Host": "Retrieval.Example:8443"})
        by_ip = await client.get("/v1/protocol", headers={"Host": "127.0.0.1:8443"})
        other = await client.post(
            "/v1/retrieval/search",
            headers={"Host": "evil.example", **token},
            json={"corpus": CORPUS, "query": "q"},
        )
        suffix = await client.get("/v1/protocol", headers={"Host": "retrieval.example.evil"})
        probe = await client.get("/healthz", headers={"Host": "10.0.0.7:8443"})
        twice = await client.get(
            "/v1/protocol", headers=[("Host", "retrieval.example"), ("Host", "evil.example")]
        )
        # One header naming two hosts, or a port that is not digits: read as the listed name's
        # before (session 43).
        glued = [
            await client.get("/v1/protocol", headers={"Host": value})
            for value in ("127.0.0.1:8443,evil.example", "retrieval.example:80x", "[::1]x")
        ]
    assert (listed.status_code, by_ip.status_code) == (200, 200)
    _problem(other, 400, "INVALID_REQUEST", "host-not-allowed")
    _problem(suffix, 400, "INVALID_REQUEST", "host-not-allowed")
    _problem(twice, 400, "INVALID_REQUEST", "host-not-allowed")
    for response in glued:
        _problem(response, 400, "INVALID_REQUEST", "host-not-allowed")
    # Orchestrator probes reach the pod by its address; they read nothing the Host could abuse.
    assert probe.status_code == 200


def test_allowed_hosts_are_host_names_without_scheme_or_path(http_world: World) -> None:
    with pytest.raises(ValueError, match="host name"):
        http_world.settings(allowedHosts=["https://retrieval.example"])
    with pytest.raises(ValueError, match="host name"):
        http_world.settings(allowedHosts=["retrieval.example/v1"])

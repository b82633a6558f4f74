"""The console's security headers on every answer under `/console`, errors included: a
black-box tester found a 405 (`POST /console/`) and a 404 two segments deep
(`/console/x/y`) answered by the router without them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from retrieval_host.http.app import create_app
from retrieval_host.http.console import SECURITY_HEADERS
from tests.support.host import World

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(http_world.settings(console={"enabled": True}), None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/console", 200),
        ("GET", "/console/", 200),
        ("HEAD", "/console/console.js", 200),
        ("GET", "/console/nope", 404),
        ("GET", "/console/x/y", 404),
        ("GET", "/console/x/console.js", 404),
        ("POST", "/console/", 405),
        ("POST", "/console", 405),
        ("PUT", "/console/console.js", 405),
        ("DELETE", "/console/x/y", 405),
    ],
)
async def test_every_console_answer_carries_the_security_headers(
    client: httpx.AsyncClient, method: str, path: str, status: int
) -> None:
    response = await client.request(method, path)
    assert response.status_code == status
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, name
    if status == 405:
        assert response.headers["allow"] == "GET, HEAD"
    if status >= 400:
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert (problem["code"], problem["reason"]) == ("INVALID_REQUEST", "route")


@pytest.fixture
async def listed_client(http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    settings = http_world.settings(
        console={"enabled": True},
        allowedOrigins=["https://listed.example"],
        allowedHosts=["host.test"],
    )
    transport = httpx.ASGITransport(app=create_app(settings, None))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


PREFLIGHT = {"Access-Control-Request-Method": "GET"}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "reason"),
    [
        # A black-box test: the Origin check answered these before the console's routes ran,
        # and its answers carried none of the headers (a cross-site form post gets this page).
        ("GET", "/console/", {"Origin": "https://evil.example"}, 403, "origin-not-allowed"),
        ("POST", "/console", {"Origin": "https://evil.example"}, 403, "origin-not-allowed"),
        ("GET", "/console/x/y", {"Origin": "null"}, 403, "origin-not-allowed"),
        (
            "OPTIONS",
            "/console/",
            {"Origin": "https://evil.example", **PREFLIGHT},
            403,
            "origin-not-allowed",
        ),
        # A listed origin's preflight is answered by the CORS middleware, also before routing.
        ("OPTIONS", "/console/", {"Origin": "https://listed.example", **PREFLIGHT}, 200, None),
        # The hygiene check answers before routing too, and the Host check before both.
        ("GET", "/console/?access_token=x", {}, 401, "token-in-query"),
        ("GET", "/console/", {"Host": "rebound.example"}, 400, "host-not-allowed"),
    ],
)
async def test_console_answers_given_before_routing_carry_the_security_headers(
    listed_client: httpx.AsyncClient,
    method: str,
    path: str,
    headers: dict[str, str],
    status: int,
    reason: str | None,
) -> None:
    response = await listed_client.request(method, path, headers=headers)
    assert response.status_code == status
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get_list(name) == [value], name
    if reason is not None:
        assert response.json()["reason"] == reason


async def test_api_answers_outside_the_console_get_no_console_policy(
    listed_client: httpx.AsyncClient,
) -> None:
    refused = await listed_client.get("/v1/corpora", headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403
    assert "content-security-policy" not in refused.headers
    # `/consoles` is not under `/console/`.
    other = await listed_client.get("/consoles", headers={"Origin": "https://evil.example"})
    assert "content-security-policy" not in other.headers


@pytest.mark.parametrize("listed", ["https://app.example:443", "https://App.Example"])
@pytest.mark.parametrize("sent", ["https://app.example", "https://app.example:443"])
async def test_a_listed_origin_matches_as_browsers_write_it(
    http_world: World, listed: str, sent: str
) -> None:
    """Probe A (session 37): `https://app.example:443` listed refused the page a browser
    serves from `https://app.example` (browsers never send the default port)."""
    settings = http_world.settings(allowedOrigins=[listed, "http://plain.example:80"])
    transport = httpx.ASGITransport(app=create_app(settings, None))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        answered = await client.get("/v1/protocol", headers={"Origin": sent})
        plain = await client.get("/v1/protocol", headers={"Origin": "http://plain.example"})
        other_port = await client.get(
            "/v1/protocol", headers={"Origin": "https://app.example:8443"}
        )
    assert answered.status_code == 200
    if sent == "https://app.example":  # what a browser sends, and reads the answer for
        assert answered.headers["access-control-allow-origin"] == sent
    assert plain.status_code == 200
    assert other_port.status_code == 403

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

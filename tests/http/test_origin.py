"""The Origin allow-list and the CORS layer it wraps agree: on which origins are listed, and on
answering every refusal as a problem (probe A, session 39: a listed origin's preflight asking
for DELETE or an unlisted header got Starlette's `400 text/plain`, and `https://App.Example:443`
listed and sent passed the Origin check but got no CORS headers)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from retrieval_host.http.app import create_app
from tests.support.host import World

pytestmark = pytest.mark.anyio

LISTED = "https://app.example"
PATH = "/v1/retrieval/search"


@pytest.fixture
async def client(http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    settings = http_world.settings(allowedOrigins=[LISTED])
    transport = httpx.ASGITransport(app=create_app(settings, None))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        ({"Access-Control-Request-Method": "DELETE"}, "cors-method-not-allowed"),
        # Methods are case-sensitive (Fetch upper-cases only the six standard ones).
        ({"Access-Control-Request-Method": "post"}, "cors-method-not-allowed"),
        (
            {
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-custom",
            },
            "cors-header-not-allowed",
        ),
        (
            {
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Private-Network": "true",
            },
            "cors-private-network-not-allowed",
        ),
    ],
)
async def test_a_listed_origins_refused_preflight_is_a_problem_naming_what_was_refused(
    client: httpx.AsyncClient, asked: dict[str, str], reason: str
) -> None:
    response = await client.options(PATH, headers={"Origin": LISTED, **asked})
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert {"type", "title", "status", "code", "detail", "requestId"} <= problem.keys()
    assert (problem["status"], problem["code"], problem["reason"]) == (
        403,
        "PERMISSION_DENIED",
        reason,
    )
    assert response.headers["x-request-id"] == problem["requestId"]
    assert "access-control-allow-origin" not in response.headers


async def test_a_listed_origins_allowed_preflight_is_still_answered_by_the_cors_layer(
    client: httpx.AsyncClient,
) -> None:
    """The host's own preflight checks are no stricter than Starlette's."""
    response = await client.options(
        PATH,
        headers={
            "Origin": LISTED,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "Authorization, content-type",
        },
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == LISTED
    assert response.headers["access-control-allow-methods"] == "GET, POST"


@pytest.mark.parametrize("sent", ["https://App.Example:443", "https://APP.example"])
async def test_an_origin_the_host_admits_gets_cors_headers_however_it_is_written(
    http_world: World, sent: str
) -> None:
    """`https://App.Example:443` listed and sent passed the Origin check (200) with no
    `Access-Control-Allow-Origin`, and its preflight got 400 'Disallowed CORS origin'. The
    header carries the form a browser sends, the only one a browser compares it with."""
    settings = http_world.settings(allowedOrigins=["https://App.Example:443"])
    transport = httpx.ASGITransport(app=create_app(settings, None))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        simple = await client.get("/v1/protocol", headers={"Origin": sent})
        preflight = await client.options(
            PATH, headers={"Origin": sent, "Access-Control-Request-Method": "POST"}
        )
    assert simple.status_code == 200
    assert simple.headers["access-control-allow-origin"] == LISTED
    assert simple.headers["access-control-expose-headers"] == "X-Request-Id, Retry-After"
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == LISTED

"""Discovery that validates: the served OpenAPI document passes openapi-spec-validator and
documents every route the app answers, `/metrics` included; a token without the metrics grant
is told which grant it lacks."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.routing import Route

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.http.app import HostApp, create_app
from retrieval_host.http.metrics import METRICS_PATH
from tests.support.host import World, build_world
from tests.support.in_process_runs import add_runs

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def runs_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("discovery")
    world = build_world(directory, local_embedding)
    close_runs = add_runs(world, directory, {})
    yield world
    close_runs()
    world.close()


@pytest.fixture(params=["retrieval-and-runs", "discovery-only"])
def app(request: pytest.FixtureRequest, runs_world: World) -> HostApp:
    driver = runs_world.driver if request.param == "retrieval-and-runs" else None
    return create_app(runs_world.settings(), driver)


@pytest.fixture
async def client(app: HostApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


def _starlette(app: object) -> Starlette:
    """The router inside the middleware chain (each middleware keeps the next as `app`)."""
    seen = 0
    while not isinstance(app, Starlette):
        app = getattr(app, "app", None) or getattr(app, "_asgi", None)
        seen += 1
        assert app is not None and seen < 20, "no Starlette router in the middleware chain"
    return app


def served_routes(app: HostApp) -> dict[str, set[str]]:
    """Every path the app answers and its methods, the `/metrics` middleware included."""
    table: dict[str, set[str]] = {METRICS_PATH: {"get"}}
    for route in _starlette(app).routes:
        assert isinstance(route, Route)
        methods = {m.lower() for m in route.methods or ()} - {"head"}
        table.setdefault(_shape(route.path), set()).update(methods)
    return table


def _shape(path: str) -> str:
    # Starlette names a parameter as Python does (`{run_id}`), the document as the wire does.
    return re.sub(r"\{[^}]+\}", "{}", path)


async def _document(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/v1/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


async def test_the_served_document_passes_the_openapi_validator(
    client: httpx.AsyncClient,
) -> None:
    document = await _document(client)
    validate(document)  # raises OpenAPIValidationError with the first error it finds
    assert document["openapi"] == "3.1.0"


async def test_every_served_route_and_method_is_in_the_document(
    app: HostApp, client: httpx.AsyncClient
) -> None:
    document = await _document(client)
    served = served_routes(app)
    documented = {_shape(path): set(methods) for path, methods in document["paths"].items()}
    assert served == documented
    assert len(served) > 1  # the walk found the router's table, not only /metrics


async def test_the_metrics_route_is_documented_as_prometheus_text_behind_its_grant(
    client: httpx.AsyncClient,
) -> None:
    operation = (await _document(client))["paths"][METRICS_PATH]["get"]
    assert operation["security"] == [{"bearerAuth": []}]
    assert set(operation["responses"]["200"]["content"]) == {"text/plain"}
    assert "metrics grant" in operation["responses"]["403"]["description"]


async def test_a_token_without_the_metrics_grant_is_told_which_grant_it_lacks(
    client: httpx.AsyncClient, runs_world: World
) -> None:
    response = await client.get(
        METRICS_PATH, headers={"Authorization": f"Bearer {runs_world.tokens['admin']}"}
    )
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "PERMISSION_DENIED"
    assert "metrics grant" in body["detail"]


def test_the_validator_catches_a_media_type_description(tmp_path: Path) -> None:
    """The check is not vacuous: the error this suite first found fails validation."""
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

    from retrieval_host.http.openapi import build_openapi

    document = build_openapi(version="1", ingest_media_types=["text/plain"], runs=True)
    validate(document)
    runs = document["paths"]["/v1/runs"]["post"]["responses"]["200"]["content"]
    runs["text/event-stream"]["description"] = "not allowed in a Media Type Object"
    with pytest.raises(OpenAPIValidationError):
        validate(document)

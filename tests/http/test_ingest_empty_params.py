"""Ingest query parameters sent empty: `title=` and `revision=` mean "not given"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from retrieval_host.http.app import HostApp, create_app
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.routes import ingest_media_types
from tests.support.host import CORPUS, World

pytestmark = pytest.mark.anyio

GUIDE = b"# Pump guide\n\nPrime the pump before the first start.\n"


@pytest.fixture
def app(http_world: World) -> HostApp:
    return create_app(http_world.settings(), http_world.driver)


@pytest.fixture
async def client(app: HostApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


async def _ingest(
    client: httpx.AsyncClient, world: World, source_id: str, query: str
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId={source_id}{query}",
        content=GUIDE,
        headers={
            "Authorization": f"Bearer {world.tokens['admin']}",
            "Content-Type": "text/markdown",
        },
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _source(client: httpx.AsyncClient, world: World, source_id: str) -> dict[str, Any]:
    response = await client.get(
        f"/v1/corpora/{CORPUS}/sources/{source_id}",
        headers={"Authorization": f"Bearer {world.tokens['admin']}"},
    )
    assert response.status_code == 200, response.text
    source: dict[str, Any] = response.json()["source"]
    return source


@pytest.mark.parametrize("query", ["&title=", "&revision=", "&title=&revision="])
async def test_an_empty_title_or_revision_is_as_if_not_given(
    client: httpx.AsyncClient, http_world: World, query: str
) -> None:
    # Probe I, session 42: `title=` stored the title "" (and so another default revision),
    # while `revision=` was refused with 422.
    source_id = "empty-" + "-".join(part.strip("&=") for part in query.split("="))
    plain = await _ingest(client, http_world, "empty-none", "")
    empty = await _ingest(client, http_world, source_id, query)
    assert empty["source"]["revision"] == plain["source"]["revision"]
    assert empty["source"]["revision"].startswith("sha256:")
    assert (await _source(client, http_world, source_id))["title"] == "Pump guide"


async def test_a_given_title_and_revision_still_count(
    client: httpx.AsyncClient, http_world: World
) -> None:
    given = await _ingest(client, http_world, "empty-given", "&title=Pumps&revision=r1")
    assert given["source"]["revision"] == "r1"
    assert (await _source(client, http_world, "empty-given"))["title"] == "Pumps"


def test_openapi_says_which_ingest_parameters_may_be_sent_empty() -> None:
    document = build_openapi(version="0", ingest_media_types=ingest_media_types())
    parameters = document["paths"]["/v1/retrieval/ingest"]["post"]["parameters"]
    empty = {p["name"] for p in parameters if p.get("allowEmptyValue")}
    assert empty == {"revision", "title"}

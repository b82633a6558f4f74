"""Metadata that users can use: attached at ingest (the `metadata` query parameter), shown on
hits and passages, and filtered on with operators before ranking."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from retrieval_host.http.app import HostApp, create_app
from tests.support.host import CORPUS, World

pytestmark = pytest.mark.anyio

REPORTS = {
    "report-2019": ("The turbine inspection found corrosion on the blades.", 2019, "en"),
    "report-2021": ("The turbine inspection found cracks on the blades.", 2021, "en"),
    "report-2023": ("Die Turbinenprüfung fand Risse an den Schaufeln.", 2023, "de"),
}


@pytest.fixture
def app(http_world: World) -> HostApp:
    return create_app(http_world.settings(), http_world.driver)


@pytest.fixture
async def client(app: HostApp, http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {http_world.tokens['admin']}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="https://host.test", headers=headers
    ) as client:
        yield client


async def ingest(
    client: httpx.AsyncClient, source_id: str, text: str, metadata: str
) -> httpx.Response:
    return await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId={source_id}&metadata={quote(metadata)}",
        content=f"---\nauthor: Inspection team\n---\n# {source_id}\n\n{text}\n".encode(),
        headers={"Content-Type": "text/markdown"},
    )


async def search(client: httpx.AsyncClient, filters: object) -> httpx.Response:
    body = {"corpus": CORPUS, "query": "turbine blade inspection", "filters": filters}
    return await client.post("/v1/retrieval/search", json=body)


async def found(client: httpx.AsyncClient, filters: object) -> set[str]:
    response = await search(client, filters)
    assert response.status_code == 200, response.text
    return {hit["source"]["id"] for hit in response.json()["hits"]}


async def test_metadata_given_at_ingest_is_shown_and_filtered_on(
    client: httpx.AsyncClient,
) -> None:
    for source_id, (text, year, lang) in REPORTS.items():
        metadata = json.dumps({"year": year, "lang": lang, "reviewed": year < 2023})
        indexed = await ingest(client, source_id, text, metadata)
        assert indexed.status_code == 200, indexed.text

    response = await search(client, {"year": {"gte": 2021}})
    hits = response.json()["hits"]
    assert {h["source"]["id"] for h in hits} == {"report-2021", "report-2023"}
    # The caller's keys sit beside what the document yields (its front matter).
    first = next(h for h in hits if h["source"]["id"] == "report-2021")
    assert first["metadata"]["year"] == 2021
    assert first["metadata"]["reviewed"] is True
    assert first["metadata"]["frontMatter"] == {"author": "Inspection team"}

    assert await found(client, {"lang": "de"}) == {"report-2023"}
    assert await found(client, {"lang": {"ne": "de"}, "year": {"lt": 2021}}) == {"report-2019"}
    assert await found(client, {"year": {"in": [2019, 2023]}}) == {"report-2019", "report-2023"}
    assert await found(client, {"year": {"nin": [2019, 2023]}, "lang": "en"}) == {"report-2021"}
    either = {"or": [{"lang": "de"}, {"reviewed": True, "year": {"gt": 2020}}]}
    assert await found(client, either) == {"report-2021", "report-2023"}
    assert await found(client, {"and": [either, {"lang": "en"}]}) == {"report-2021"}
    assert await found(client, {"year": {"gt": "2020"}}) == set()  # a string never compares

    # The passage behind a citation shows the same metadata.
    chunk = first["chunkId"]
    passage = await client.get(f"/v1/corpora/{CORPUS}/passages/{chunk}")
    assert passage.status_code == 200, passage.text
    assert passage.json()["metadata"] == first["metadata"]


@pytest.mark.parametrize(
    ("filters", "fault"),
    [
        ({"year": ["2019"]}, "a list is not a value"),
        ({"year": {"like": 1}}, "unknown operator"),
        ({"year": {"gt": None}}, "compares a number or a string"),
        ({"and": [{"or": [{"and": [{"year": 1}]}]}]}, "at most 3 objects deep"),
        ({"or": [{f"k{i}": i for i in range(16)}] * 16, "x": 1}, "at most 256 conditions"),
    ],
)
async def test_a_filter_the_rules_refuse_gets_a_typed_answer(
    client: httpx.AsyncClient, filters: object, fault: str
) -> None:
    response = await search(client, filters)
    assert response.status_code in (400, 422), response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == "INVALID_REQUEST"
    assert fault in body["detail"], body


@pytest.mark.parametrize(
    ("metadata", "status", "fault"),
    [
        ("{not json", 422, "metadata"),
        ('["a"]', 422, "metadata"),
        ('{"tags": ["a"]}', 422, "metadata"),
        ('{"a": 1, "a": 2}', 400, "once"),
        (json.dumps({f"k{i}": i for i in range(17)}), 422, "metadata"),
        (json.dumps({f"k{i}": "\u00e9" * 256 for i in range(8)}), 422, "4096 bytes"),  # UTF-8
        (json.dumps({"lang": "x\u0000"}), 422, "metadata"),
        (json.dumps({" lang": "en"}), 422, "metadata key"),
    ],
)
async def test_bad_metadata_is_refused_and_the_previous_revision_stays(
    client: httpx.AsyncClient, metadata: str, status: int, fault: str
) -> None:
    kept = await ingest(client, "kept", "The turbine manual, blade chapter.", '{"v": 1}')
    assert kept.status_code == 200, kept.text
    revision = kept.json()["source"]["revision"]

    refused = await ingest(client, "kept", "A different text entirely.", metadata)
    assert refused.status_code == status, refused.text
    assert fault in refused.json()["detail"], refused.json()

    source = await client.get(f"/v1/corpora/{CORPUS}/sources/kept")
    assert source.status_code == 200, source.text
    assert source.json()["source"]["revision"] == revision
    assert source.json()["source"]["metadata"]["v"] == 1


async def test_metadata_bytes_are_counted_in_utf8(client: httpx.AsyncClient) -> None:
    # A black-box test: `é` counted the 6 bytes of its escape, so 1,477 bytes of UTF-8 were
    # refused as "over 4096 bytes".
    given = {f"k{i}": "\u00e9" * 256 for i in range(7)}  # 3,654 bytes of UTF-8, 10,822 escaped
    response = await ingest(
        client, "accents", "The turbine manual, hub chapter.", json.dumps(given)
    )
    assert response.status_code == 200, response.text
    shown = await client.get(f"/v1/corpora/{CORPUS}/sources/accents")
    assert {k: v for k, v in shown.json()["source"]["metadata"].items() if k in given} == given

"""`idleTimeoutMs` on an ingest, over real TLS: an ingest that makes no progress within it ends
with a typed 408 `TIMEOUT` (`idle-timeout`) and indexes nothing; a long enough one indexes."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host_client import Client, HostTimeoutError
from tests.support.host import CORPUS, RunningHost, World, build_world, serve_in_thread

# About 200 passages: several embedding slices, each far longer than a millisecond.
DOCUMENT = "\n\n".join(
    f"## Step {i}\n\nCheck valve {i} for wear, then log the pressure reading of gauge {i} "
    "before the next shift takes over the watch." * 3
    for i in range(200)
).encode()


@pytest.fixture(scope="module")
def idle_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("idle-world"), local_embedding)
    yield world
    world.close()


@pytest.fixture(scope="module")
def idle_host(idle_world: World) -> Iterator[RunningHost]:
    with serve_in_thread(idle_world.settings(), idle_world.driver, idle_world.tls) as host:
        yield host


def _ingest(host: RunningHost, world: World, source_id: str, idle_ms: int) -> httpx.Response:
    query = urlencode({"corpus": CORPUS, "sourceId": source_id, "idleTimeoutMs": idle_ms})
    return httpx.post(
        f"{host.base_url}/v1/retrieval/ingest?{query}",
        content=DOCUMENT,
        headers={
            "Authorization": f"Bearer {world.tokens['admin']}",
            "Content-Type": "text/markdown",
        },
        verify=world.tls.client_context(),
        timeout=300,
    )


def test_an_ingest_without_progress_within_its_idle_timeout_ends_typed_and_keeps_nothing(
    idle_host: RunningHost, idle_world: World
) -> None:
    stalled = _ingest(idle_host, idle_world, "valves", idle_ms=1)
    assert stalled.status_code == 408, stalled.text
    problem = stalled.json()
    assert (problem["code"], problem["reason"]) == ("TIMEOUT", "idle-timeout")
    listed = httpx.get(
        f"{idle_host.base_url}/v1/corpora/{CORPUS}/sources",
        headers={"Authorization": f"Bearer {idle_world.tokens['admin']}"},
        verify=idle_world.tls.client_context(),
    ).json()
    assert "valves" not in [s["id"] for s in listed["sources"]]

    done = _ingest(idle_host, idle_world, "valves", idle_ms=600_000)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "indexed" and done.json()["chunkCount"] > 64


def test_the_client_passes_the_idle_timeout_and_raises_its_class(
    idle_host: RunningHost, idle_world: World
) -> None:
    with Client(
        idle_host.base_url, token=idle_world.tokens["admin"], ca_bundle=idle_world.tls.ca_file
    ) as client:
        with pytest.raises(HostTimeoutError) as excinfo:
            client.ingest_context(
                DOCUMENT,
                corpus=CORPUS,
                source_id="gauges",
                media_type="text/markdown",
                idle_timeout_ms=1,
            )
        assert excinfo.value.reason == "idle-timeout"

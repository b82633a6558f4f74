"""A host over a read-only store (a snapshot, a replica) over real TLS: it searches, says in
discovery that it does not index, and answers every write with a typed 409 `STORE_READ_ONLY`
before parsing anything, leaving the index as it was."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings
from retrieval_host_client import Client, StoreReadOnlyError
from tests.support.host import CORPUS, World, build_world, serve_in_thread


@pytest.fixture(scope="module")
def read_only_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[tuple[World, Driver]]:
    world = build_world(tmp_path_factory.mktemp("read-only-world"), local_embedding)
    writable = world.driver.retrieval.corpus(CORPUS)
    store = SqliteVectorStore.open(world.directory / "store" / "library.sqlite", read_only=True)
    corpus = Corpus(
        CORPUS,
        writable.version,
        local_embedding,
        store,
        writable.authorize,
        chunking=ChunkingSettings().as_identity(),
    )
    driver = Driver(RetrievalService([corpus]))
    yield world, driver
    store.close()
    world.close()


def test_a_read_only_host_searches_and_refuses_writes_with_a_typed_409(
    read_only_world: tuple[World, Driver],
) -> None:
    world, driver = read_only_world
    token = world.tokens["admin"]
    with serve_in_thread(world.settings(), driver, world.tls) as host:
        http = httpx.Client(
            base_url=host.base_url,
            verify=world.tls.client_context(),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        with http:
            protocol = http.get("/v1/protocol").json()
            assert "scoped-retrieval" in protocol["capabilities"]
            assert "retrieval-indexing" not in protocol["capabilities"]
            (corpus,) = http.get("/v1/corpora").json()["corpora"]
            assert corpus["id"] == CORPUS and corpus["readOnly"] is True

            found = http.post("/v1/retrieval/search", json={"corpus": CORPUS, "query": "handbook"})
            assert found.status_code == 200 and found.json()["hits"]
            before = http.get(f"/v1/corpora/{CORPUS}/sources").json()

            query = urlencode({"corpus": CORPUS, "sourceId": "note", "revision": "1"})
            ingest = http.post(
                f"/v1/retrieval/ingest?{query}",
                content=b"# A note\n\nWritten to a snapshot.\n",
                headers={"Content-Type": "text/markdown"},
            )
            delete = http.post(
                "/v1/retrieval/delete",
                json={"corpus": CORPUS, "sourceId": "handbook", "revision": "r1"},
            )
            for response in (ingest, delete):
                assert response.status_code == 409, response.text
                assert response.headers["content-type"] == "application/problem+json"
                problem = response.json()
                assert problem["code"] == "STORE_READ_ONLY"
                assert problem["title"] == "Store is read-only"
            assert http.get(f"/v1/corpora/{CORPUS}/sources").json() == before

        # The client raises its own class for it.
        with Client(host.base_url, token=token, ca_bundle=world.tls.ca_file) as client:
            with pytest.raises(StoreReadOnlyError) as excinfo:
                client.delete_context(corpus=CORPUS, source_id="handbook", revision="r1")
            assert excinfo.value.code == "STORE_READ_ONLY" and excinfo.value.status == 409

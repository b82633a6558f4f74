"""A client that goes away stops the work it started: the search scan ends between batches."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from tests.support.host import (
    BIG_CORPUS,
    RunningHost,
    World,
    build_world,
    raw_connect,
    serve_in_thread,
    wait_until,
)

# One-row scan batches over this many precomputed vectors: a scan of a few hundred ms.
BIG_ROWS = 100_000


@pytest.fixture(scope="module")
def big_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(
        tmp_path_factory.mktemp("big-world"), local_embedding, big_rows=BIG_ROWS, scan_batch_rows=1
    )
    yield world
    world.close()


@pytest.fixture(scope="module")
def big_host(big_world: World) -> Iterator[RunningHost]:
    with serve_in_thread(big_world.settings(), big_world.driver, big_world.tls) as host:
        yield host


def _search_request(world: World) -> bytes:
    body = json.dumps({"corpus": BIG_CORPUS, "query": "anything at all", "limit": 3}).encode()
    head = (
        "POST /v1/retrieval/search HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens['admin']}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def test_a_search_that_stays_connected_scans_every_row(
    big_host: RunningHost, big_world: World
) -> None:
    store = big_world.stores[BIG_CORPUS]
    before = store.counters
    started = time.monotonic()
    with raw_connect(big_host) as conn:
        conn.sendall(_search_request(big_world))
        response = conn.read_response()
    elapsed = time.monotonic() - started
    assert response.status == 200
    assert len(response.json()["hits"]) == 3
    after = store.counters
    assert after.rows_scored - before.rows_scored == BIG_ROWS
    assert after.scans_cancelled == before.scans_cancelled
    assert elapsed > 0.1  # long enough for the disconnect test to land inside it


def test_a_disconnect_during_a_long_search_stops_the_scan(
    big_host: RunningHost, big_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = big_world.stores[BIG_CORPUS]
    before = store.counters
    # The order is fixed, not left to the scheduler: the client disconnects once the scan has
    # scored rows (a scan counted as started may not have scored one yet), and the scan, after
    # each batch, waits until its token is cancelled (else a loaded machine could let it end
    # before the disconnect is seen). A disconnect that never cancels it fails the test.
    progress = CancelToken.progress

    def held_progress(token: CancelToken) -> None:
        progress(token)
        deadline = time.monotonic() + 30
        while store.counters.rows_scored > before.rows_scored and not token.cancelled:
            assert time.monotonic() < deadline, "the disconnect never cancelled the scan"
            time.sleep(0.002)

    monkeypatch.setattr(CancelToken, "progress", held_progress)
    with raw_connect(big_host) as conn:
        conn.sendall(_search_request(big_world))
        wait_until(lambda: store.counters.rows_scored > before.rows_scored, what="rows scored")
    # The connection is closed here, while the scan runs.
    wait_until(lambda: store.counters.scans_cancelled > before.scans_cancelled, what="cancel")
    after = store.counters
    assert after.scans_cancelled == before.scans_cancelled + 1
    assert 0 < after.rows_scored - before.rows_scored < BIG_ROWS
    # The request's slot is free again: the worker thread has returned.
    wait_until(lambda: big_host.app.counters.in_flight == 0, what="slot released")
    with big_host.client() as client:
        assert client.get("/readyz").status_code == 200

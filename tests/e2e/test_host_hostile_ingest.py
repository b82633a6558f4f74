"""Costly uploads over real uvicorn + TLS (issue 13, defect 2): a client that hangs up frees its
concurrency slot within a second (the parse worker is killed), searches are served meanwhile,
and a document past a limit answers a typed 422 with the previous revision still served."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.driver import shared_parse_pool
from tests.support import ingest_documents as docs
from tests.support.host import (
    CORPUS,
    RunningHost,
    World,
    build_world,
    raw_connect,
    serve_in_thread,
    wait_until,
)

# Under every static bound (45,000 `(x) Tj` a page, which the operator scan counts as 90,000,
# 1.8 M in all) and still ~25 s of pypdf extraction on an idle core: only the kill ends it.
SLOW_PDF_PAGES, SLOW_PDF_OPERATORS = 20, 45_000
SLOT_RELEASE_BOUND_S = 1.0


@pytest.fixture(scope="module")
def hostile_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("hostile-world"), local_embedding)
    yield world
    world.close()


@pytest.fixture(scope="module")
def hostile_host(hostile_world: World) -> Iterator[RunningHost]:
    settings = hostile_world.settings(limits={"maxConcurrency": 2, "ingestDeadlineS": 60})
    with serve_in_thread(settings, hostile_world.driver, hostile_world.tls) as host:
        yield host


def _ingest_request(
    world: World, source_id: str, media_type: str, body: bytes, *, accept: str = "*/*"
) -> bytes:
    query = urlencode({"corpus": CORPUS, "sourceId": source_id})
    head = (
        f"POST /v1/retrieval/ingest?{query} HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens['admin']}\r\n"
        f"Accept: {accept}\r\n"
        f"Content-Type: {media_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def _search(host: RunningHost, world: World) -> int:
    with host.client(headers={"Authorization": f"Bearer {world.tokens['admin']}"}) as client:
        response = client.post(
            "/v1/retrieval/search", json={"corpus": CORPUS, "query": "rotate a token"}
        )
    return response.status_code


def test_a_client_that_hangs_up_during_a_costly_parse_frees_its_slot_within_a_second(
    hostile_host: RunningHost, hostile_world: World
) -> None:
    pool = shared_parse_pool()
    killed = pool.counters.killed
    slow = docs.operator_heavy_pdf(SLOW_PDF_PAGES, SLOW_PDF_OPERATORS)
    with raw_connect(hostile_host) as conn:
        conn.sendall(_ingest_request(hostile_world, "slow", "application/pdf", slow))
        wait_until(lambda: pool.counters.busy == 1, timeout=30, what="the parse to start")
        assert hostile_host.app.counters.in_flight == 1
        # The other slot serves searches while the worker parses.
        assert _search(hostile_host, hostile_world) == 200
        assert not conn.answered()
        hung_up = time.monotonic()
    wait_until(lambda: hostile_host.app.counters.in_flight == 0, what="the slot to be freed")
    released = time.monotonic() - hung_up
    assert released < SLOT_RELEASE_BOUND_S
    wait_until(lambda: pool.counters.killed == killed + 1, what="the worker to be killed")
    assert pool.counters.busy == 0
    assert _search(hostile_host, hostile_world) == 200


def test_a_client_that_leaves_a_streamed_ingest_cancels_it_and_frees_its_slot(
    hostile_host: RunningHost, hostile_world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="retrieval_host.access")
    pool = shared_parse_pool()
    killed = pool.counters.killed
    slow = docs.operator_heavy_pdf(SLOW_PDF_PAGES, SLOW_PDF_OPERATORS)
    request = _ingest_request(
        hostile_world, "slow-streamed", "application/pdf", slow, accept="text/event-stream"
    )
    with raw_connect(hostile_host) as conn:
        conn.sendall(request)
        wait_until(lambda: pool.counters.busy == 1, timeout=30, what="the parse to start")
        # The stream is open: its head and first events arrived while the worker parses.
        assert conn.read_until(b"event: ingest.progress", timeout=30), conn.buffer
        assert conn.buffer.startswith(b"HTTP/1.1 200 ")
        assert b"content-type: text/event-stream" in conn.buffer.lower()
        assert b"event: ingest.started" in conn.buffer
        hung_up = time.monotonic()
    wait_until(lambda: hostile_host.app.counters.in_flight == 0, what="the slot to be freed")
    assert time.monotonic() - hung_up < SLOT_RELEASE_BOUND_S
    wait_until(lambda: pool.counters.killed == killed + 1, what="the worker to be killed")
    assert hostile_world.stores[CORPUS].get_source(CORPUS, "team", "slow-streamed") is None

    # Its access line says so, as a run's does (a black-box test: a plain 200, and nothing
    # counted in the streamed failures).
    def line() -> dict[str, Any] | None:
        fields = [
            getattr(r, "fields", {}) for r in caplog.records if r.name == "retrieval_host.access"
        ]
        return next((f for f in fields if f.get("route") == "/v1/retrieval/ingest"), None)

    wait_until(lambda: line() is not None, what="the cut stream's access line")
    assert {k: (line() or {}).get(k) for k in ("status", "code")} == {
        "status": 200,
        "code": "CANCELLED",
    }


def test_an_operator_bomb_over_https_is_a_typed_422_and_the_old_revision_stays(
    hostile_host: RunningHost, hostile_world: World
) -> None:
    auth = {"Authorization": f"Bearer {hostile_world.tokens['admin']}"}
    with hostile_host.client(headers=auth) as client:
        params = {"corpus": CORPUS, "sourceId": "bombed"}
        first = client.post(
            "/v1/retrieval/ingest",
            params=params,
            content=b"# Bombed\n\nThe first revision of this note.\n",
            headers={"Content-Type": "text/markdown"},
        )
        assert first.status_code == 200
        started = time.monotonic()
        refused = client.post(
            "/v1/retrieval/ingest",
            params=params,
            content=docs.operator_bomb_pdf(500_000),
            headers={"Content-Type": "application/pdf"},
        )
        elapsed = time.monotonic() - started
    assert refused.status_code == 422
    assert refused.headers["content-type"].startswith("application/problem+json")
    body = refused.json()
    assert (body["code"], body["reason"]) == ("DOCUMENT_TOO_COMPLEX", "pdf-operators")
    assert elapsed < 15.0  # generous on a loaded host; the bomb took ~46 s before
    stored = hostile_world.stores[CORPUS].get_source(CORPUS, "team", "bombed")
    assert stored is not None and stored.revision == first.json()["source"]["revision"]

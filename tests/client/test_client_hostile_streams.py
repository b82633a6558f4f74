"""Streams and listings a broken or hostile host may send (probe C, session 40), in both
modes: a stream kept trickling after its terminal event, events after that event, and a
listing whose cursors go round in a circle.

The host is the misbehaving TLS server of `canned_host.py`; a trickling answer is an iterator
of bytes that paces itself on the server's stop event.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from retrieval_host_client import IndexResponse, ProtocolError
from retrieval_host_client._ingest_stream import IngestEventReader
from retrieval_host_client._responses import RunEventReader, check_same_source
from tests.client.canned_host import Action, Received, canned_host, http_response
from tests.client.conftest import Connect
from tests.client.modes import ClientApi
from tests.support.host import CORPUS, World

RUN = {"provider": "extractive", "model": "extractive", "input": "How do I rotate a token?"}
SOURCE = {"id": "n", "revision": "r1"}
RESULT = {
    "runId": "run_1", "status": "completed", "provider": "p", "model": "m", "text": "An answer.",
    "sources": [{"id": "c1", "origin": "retrieval", "source": SOURCE, "location": {}}],
    "receipts": [{"sequence": 1, "query": "q", "key": "k", "startedAt": "t", "status": "ok",
                  "sourceIds": ["c1"]}],
    "usage": {"generation": {}, "embedding": {}}, "createdAt": "t", "completedAt": "t",
}  # fmt: skip
INDEXED = {"corpus": CORPUS, "source": SOURCE, "status": "indexed", "chunkCount": 1,
           "documentSha256": "0" * 64, "replacedRevision": None, "usage": {}}  # fmt: skip


def _event(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


RUN_DONE = _event({"type": "run.started", "runId": "run_1", "createdAt": "t"}) + _event(
    {"type": "run.completed", "result": RESULT}
)
INGEST_DONE = _event({"type": "ingest.started"}) + _event(
    {"type": "ingest.completed", "result": INDEXED}
)
DELTA = _event({"type": "run.delta", "text": "after the end"})
CALLS: dict[str, tuple[bytes, Callable[[ClientApi], object]]] = {
    "run": (RUN_DONE, lambda api: _until_done(api)),
    "ingest": (
        INGEST_DONE,
        lambda api: (
            api.ingest_context(
                b"# Note\n", corpus=CORPUS, source_id="n", media_type="text/markdown"
            ).status
        ),
    ),
}


def _until_done(api: ClientApi) -> str:
    with api.stream_run(RUN) as stream:
        return stream.until_done().text


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _trickling(events: bytes, stopping: threading.Event) -> Iterator[bytes]:
    """The terminal event, then a 3-byte heartbeat every 0.2 s until the server stops."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    yield head + b"\r\n" + _chunk(events)
    while not stopping.wait(0.2):
        yield _chunk(b": \n")


@pytest.mark.parametrize("call", list(CALLS))
def test_a_host_trickling_after_the_terminal_event_does_not_hold_the_call(
    connect: Connect, client_world: World, call: str
) -> None:
    # Probe C: the sync client read on until 64 KiB had arrived (about three hours at this
    # pace) before handing back a finished run or ingest; the async one stopped after 0.5 s.
    events, make = CALLS[call]
    stopping = threading.Event()
    done = threading.Event()
    answers: list[object] = []
    with canned_host(client_world.tls, lambda request: _trickling(events, stopping)) as host:
        api = connect(base_url=host.base_url)

        def work() -> None:
            answers.append(make(api))
            done.set()

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        finished = done.wait(15)
        stopping.set()
    worker.join(30)
    assert finished, "the call was held by a stream that had ended"
    assert answers == ["An answer." if call == "run" else "indexed"]


# --- events after the terminal event --------------------------------------------------------


def _split_anywhere(body: bytes) -> list[list[bytes]]:
    """The body whole, and cut at every byte: the chunks a host's writes may arrive in."""
    return [[body], *([body[:i], body[i:]] for i in range(1, len(body)))]


def test_what_follows_a_runs_terminal_event_is_ignored_however_the_bytes_arrive() -> None:
    # Probe C: a delta in the same read as `run.completed` was refused, one in a later read
    # was dropped. One rule now: the terminal event is the answer; nothing after it is read.
    body = RUN_DONE + DELTA + b"event: run.started\ndata: {not json}\n\n"
    for chunks in _split_anywhere(body):
        reader = RunEventReader()
        events = [event.type for chunk in chunks for event in reader.feed(chunk)]
        assert events == ["run.started", "run.completed"]
        assert reader.outcome().text == "An answer."


def test_what_follows_an_ingests_terminal_event_is_ignored_however_the_bytes_arrive() -> None:
    body = INGEST_DONE + _event({"type": "ingest.progress", "phase": "parse"})
    progress: list[str] = []
    for chunks in _split_anywhere(body):
        reader = IngestEventReader(
            check_same_source(CORPUS, "n"), lambda event: progress.append(event.phase)
        )
        for chunk in chunks:
            reader.feed(chunk)
        assert isinstance(reader.outcome(), IndexResponse)
    assert progress == []


def test_a_stream_with_an_event_after_its_end_in_one_write_gives_the_result(
    connect: Connect, client_world: World
) -> None:
    answer = http_response(200, RUN_DONE + DELTA, content_type="text/event-stream", close=True)
    with canned_host(client_world.tls, lambda request: answer) as host:
        api = connect(base_url=host.base_url)
        with api.stream_run(RUN) as stream:
            seen = [event.type for event in stream]
            result = stream.until_done()
    assert seen == ["run.started", "run.completed"]
    assert result.text == "An answer."


# --- listings ---------------------------------------------------------------------------------

LISTING = {"id": "s", "revision": "r1", "title": "S", "chunkCount": 1, "bytes": 1}
# Each cursor leads to the next: a circle of two pages after the first.
CIRCLE = {None: "aa", "aa": "bb", "bb": "aa"}


def _circling() -> Callable[[Received], Action]:
    served = itertools.count(1)

    def respond(request: Received) -> Action:
        cursor = parse_qs(urlsplit(request.target).query).get("cursor", [None])[0]
        # Past a dozen pages the circle ends, so a client that follows it stops (and fails).
        following = CIRCLE[cursor] if next(served) < 12 else None
        page = {"sources": [LISTING], "nextCursor": following}
        return http_response(200, json.dumps(page).encode())

    return respond


def test_a_listing_whose_cursors_go_round_in_a_circle_is_refused(
    connect: Connect, client_world: World
) -> None:
    # Probe C: only a cursor equal to the one just sent was refused, so A, B, A paged forever.
    with canned_host(client_world.tls, _circling()) as host:
        api = connect(base_url=host.base_url)
        sources = api.list_sources(CORPUS)
        listed = [next(sources).id for _ in range(3)]  # the first page, then the circle's two
        with pytest.raises(ProtocolError, match="cursor of an earlier page"):
            next(sources)
        pages = len(host.received())
    assert pages == 3
    assert listed == ["s", "s", "s"]

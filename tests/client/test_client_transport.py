"""Connection failures, timeouts, odd error bodies and protocol violations, in both modes.

The misbehaving host is a real TLS server on loopback (`canned_host.py`) that reads each
request whole before it answers, drops the connection or stays silent.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import ssl
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from anyio.from_thread import start_blocking_portal

from retrieval_host_client import (
    APIStatusError,
    AsyncClient,
    ClientClosedError,
    ConflictError,
    HostBusyError,
    InternalServerError,
    ProtocolError,
    RetrievalHostConnectionError,
    RetrievalHostTimeoutError,
    ServiceUnavailableError,
    UpstreamError,
)
from retrieval_host_client._responses import transport_error
from tests.client.canned_host import DROP, SILENT, Action, Received, canned_host, http_response
from tests.client.conftest import Connect
from tests.client.modes import ClientApi, PortalClient
from tests.support.host import CORPUS, RunningHost, World

PROTOCOL = {
    "name": "retrieval-host",
    "version": "1",
    "capabilities": ["scoped-retrieval", "retrieval-indexing"],
    "limits": {"maxBodyBytes": 1024, "maxConcurrency": 1, "headerTimeoutS": 1, "bodyTimeoutS": 1},
    "auth": {"scheme": "bearer"},
}
INDEX = {
    "corpus": CORPUS,
    "source": {"id": "dropped", "revision": "r1"},
    "chunks": [{"id": "dropped-0", "text": "A passage the host never confirms."}],
}
RUN = {"provider": "extractive", "model": "extractive", "input": "How do I rotate a token?"}


def _json(status: int, doc: object, **kwargs: Any) -> bytes:
    return http_response(status, json.dumps(doc).encode(), **kwargs)


def _problem(status: int, code: str, headers: dict[str, str] | None = None) -> bytes:
    doc = {
        "type": "urn:x",
        "title": "t",
        "status": status,
        "code": code,
        "detail": "d",
        "requestId": "0" * 32,
    }
    return _json(status, doc, content_type="application/problem+json", headers=headers)


def _drop_mutations(request: Received) -> Action:
    if request.method == "GET":
        return _json(200, PROTOCOL)  # keep-alive: the mutation then reuses this connection
    return DROP


MUTATIONS: dict[str, Callable[[ClientApi], object]] = {
    "index": lambda api: api.index_context(INDEX),
    "ingest": lambda api: api.ingest_context(
        b"# Note\n\nText.\n", corpus=CORPUS, source_id="n", media_type="text/markdown"
    ),
    "delete": lambda api: api.delete_context(corpus=CORPUS, source_id="n", revision="r1"),
    "run": lambda api: api.run(RUN),
    "stream_run": lambda api: api.stream_run(RUN).__enter__(),
}


@pytest.mark.parametrize("operation", list(MUTATIONS))
def test_a_dropped_mutation_raises_the_connection_branch_and_is_never_resent(
    connect: Connect, client_world: World, operation: str
) -> None:
    with canned_host(client_world.tls, _drop_mutations) as host:
        api = connect(base_url=host.base_url)
        assert api.discover().version == "1"
        with pytest.raises(RetrievalHostConnectionError) as caught:
            MUTATIONS[operation](api)
        assert not isinstance(caught.value, RetrievalHostTimeoutError)
        assert caught.value.request_sent is True
        assert caught.value.code == "CONNECTION_ERROR"
        posts = [r for r in host.received() if r.method == "POST"]
        connections = host.connections
    assert len(posts) == 1, "the mutation reached the host once and was not sent again"
    assert connections == 1, "no second connection was opened to retry it"
    if operation == "index":
        assert json.loads(posts[0].body)["source"]["id"] == "dropped"


def test_a_silent_host_raises_the_timeout_branch(connect: Connect, client_world: World) -> None:
    with canned_host(client_world.tls, lambda request: SILENT) as host:
        api = connect(base_url=host.base_url, timeout=0.3)
        with pytest.raises(RetrievalHostTimeoutError) as caught:
            api.index_context(INDEX)
        assert isinstance(caught.value, RetrievalHostConnectionError)
        assert caught.value.code == "CLIENT_TIMEOUT"
        assert len(host.received()) == 1


def test_a_refused_connection_says_nothing_was_sent(connect: Connect) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = connect(base_url=f"https://127.0.0.1:{port}")
    with pytest.raises(RetrievalHostConnectionError) as caught:
        api.index_context(INDEX)
    assert caught.value.request_sent is False


def test_without_the_custom_ca_the_tls_handshake_fails_before_sending(
    connect: Connect, client_host: RunningHost
) -> None:
    api = connect(ca_bundle=None)
    with pytest.raises(RetrievalHostConnectionError) as caught:
        api.discover()
    assert caught.value.request_sent is False
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


@pytest.mark.parametrize(
    ("answer", "expected", "code", "status"),
    [
        (http_response(502, b"<html>Bad gateway</html>", content_type="text/html"),
         UpstreamError, "HTTP_502", 502),
        (http_response(503, b"busy", content_type="text/plain"), ServiceUnavailableError,
         "HTTP_503", 503),
        (_problem(409, "QUOTA_EXHAUSTED"), ConflictError, "QUOTA_EXHAUSTED", 409),
        (_problem(418, "TEAPOT"), APIStatusError, "TEAPOT", 418),
        (_problem(503, "HOST_BUSY"), HostBusyError, "HOST_BUSY", 503),
        (_json(500, {"error": "not a problem"}), InternalServerError, "HTTP_500", 500),
    ],
    ids=["html-502", "text-503", "unknown-code-409", "unknown-code-418", "busy", "json-500"],
)  # fmt: skip
def test_error_bodies_map_by_code_then_by_status(
    connect: Connect,
    client_world: World,
    answer: bytes,
    expected: type[APIStatusError],
    code: str,
    status: int,
) -> None:
    with (
        canned_host(client_world.tls, lambda request: answer) as host,
        pytest.raises(APIStatusError) as caught,
    ):
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q")
    error = caught.value
    # Exactly this class: an unknown code falls back to the class of its status.
    assert type(error) is expected
    assert error.code == code
    assert error.status == status


def _hit(chunk_id: str, source: str = "s") -> dict[str, Any]:
    return {
        "chunkId": chunk_id,
        "source": {"id": source, "revision": "r1"},
        "location": {},
        "text": "t",
        "documentSha256": "0" * 64,
        "score": 0.5,
        "retrievedAt": "2026-01-01T00:00:00Z",
        "scope": {"corpus": CORPUS, "indexVersion": "v", "namespace": "n"},
    }


def _search(hits: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "hits": hits,
        "truncated": False,
        "retrievedAt": "2026-01-01T00:00:00Z",
        "scope": None,
        "usage": {"embedding": {"requests": 1, "inputTokens": 3}},
    }


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (http_response(200, b"{not json"), "not a valid SearchResponse"),
        (_json(200, _search([_hit("a"), _hit("a")])), "returned twice"),
        (_json(200, _search([_hit("a", source="other")])), "not asked for"),
        (
            http_response(
                200, json.dumps(_search([{**_hit("a"), "score": float("nan")}])).encode()
            ),
            "not a valid SearchResponse",
        ),
        (
            _json(200, _search([{**_hit("a"), "location": {"startLine": 9, "endLine": 3}}])),
            "not a valid SearchResponse",
        ),
        (_json(200, _search([{**_hit("a"), "location": {"page": 0}}])), "not a valid"),
    ],
    ids=["malformed", "duplicate-hit", "unasked-source", "nan-score", "inverted-lines", "page-0"],
)
def test_a_search_answer_that_breaks_the_protocol_raises(
    connect: Connect, client_world: World, answer: bytes, message: str
) -> None:
    with (
        canned_host(client_world.tls, lambda request: answer) as host,
        pytest.raises(ProtocolError, match=message),
    ):
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q", source_ids=["s"])


def _sse(*events: tuple[str, dict[str, Any]], tail: bytes = b"") -> bytes:
    body = b": ping\n\n" + b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )
    return http_response(200, body + tail, content_type="text/event-stream", close=True)


STARTED = ("run.started", {"type": "run.started", "runId": "run_1", "createdAt": "now"})


def _completed(sources: list[str], receipts: list[str]) -> tuple[str, dict[str, Any]]:
    result = {
        "runId": "run_1",
        "status": "completed",
        "provider": "extractive",
        "model": "extractive",
        "text": "An answer.",
        "sources": [
            {"id": s, "origin": "retrieval", "source": {"id": "s", "revision": "r1"},
             "location": {}}
            for s in sources
        ],
        "receipts": [
            {"sequence": 1, "query": "q", "key": "k", "startedAt": "now", "status": "ok",
             "sourceIds": receipts}
        ],
        "usage": {"generation": {}, "embedding": {}},
        "createdAt": "now",
        "completedAt": "now",
    }  # fmt: skip
    return ("run.completed", {"type": "run.completed", "result": result})


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_sse(STARTED, ("run.progress", {"type": "run.progress", "corpus": CORPUS})),
         "without its phase"),
        (_sse(STARTED, _completed(["c1", "c2"], ["c1"])), "references no returned hit"),
        (_sse(STARTED, _completed(["c1", "c1"], ["c1"])), "twice"),
        (_sse(("run.delta", {"type": "run.delta", "text": "x"})), "before run.started"),
        (_sse(STARTED), "before the run ended"),
        (_sse(STARTED, tail=b"event: run.delta\ndata: {\"type\""), "middle of an event"),
        (_json(200, {"runId": "run_1"}), "expected an event stream"),
    ],
    ids=["no-phase", "manifest", "duplicate-manifest", "order", "cut", "cut-mid-event",
         "not-a-stream"],
)  # fmt: skip
def test_a_run_stream_that_breaks_the_protocol_raises(
    connect: Connect, client_world: World, answer: bytes, message: str
) -> None:
    seen: list[str] = []
    with canned_host(client_world.tls, lambda request: answer) as host:
        api = connect(base_url=host.base_url)
        with pytest.raises(ProtocolError, match=message), api.stream_run(RUN) as stream:
            seen.extend(event.type for event in stream)
    assert "run.completed" not in seen


def test_a_valid_canned_stream_yields_typed_events_and_skips_unknown_ones(
    connect: Connect, client_world: World
) -> None:
    future = ("run.future", {"type": "run.future", "anything": 1})
    progress = ("run.progress", {"type": "run.progress", "phase": "retrieval.scan", "rows": 3})
    answer = _sse(STARTED, future, progress, _completed(["c1"], ["c1", "c2"]))
    with canned_host(client_world.tls, lambda request: answer) as host:
        api = connect(base_url=host.base_url)
        with api.stream_run(RUN) as stream:
            events = list(stream)
            result = stream.until_done()
        sent = host.received()[0]
    assert [e.type for e in events] == ["run.started", "run.progress", "run.completed"]
    assert events[1].type == "run.progress" and events[1].context == {"rows": 3}
    assert result.sources[0].id == "c1"
    assert stream.run_id == "run_1"
    assert sent.headers["accept"] == "text/event-stream"
    assert json.loads(sent.body) == RUN


@pytest.mark.parametrize("method", ["run", "get_run"])
def test_a_run_result_with_a_manifest_entry_of_no_returned_hit_raises(
    connect: Connect, client_world: World, method: str
) -> None:
    result = _completed(["c1", "c9"], ["c1"])[1]["result"]
    doc = result if method == "run" else {"runId": "run_1", "status": "completed",
                                          "createdAt": "now", "result": result}  # fmt: skip
    with canned_host(client_world.tls, lambda request: _json(200, doc)) as host:
        api = connect(base_url=host.base_url)
        with pytest.raises(ProtocolError, match="'c9' references no returned hit"):
            api.run(RUN) if method == "run" else api.get_run("run_1")
        if method == "get_run":
            with pytest.raises(ProtocolError, match="asked for run"):
                api.get_run("run_2")


def _in_30_s() -> bytes:
    # Made when the test runs: a date fixed at collection would have passed by then.
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    return _problem(503, "HOST_BUSY", {"Retry-After": when})


@pytest.mark.parametrize(
    ("answer", "low", "high"),
    [
        (lambda: _problem(503, "HOST_BUSY", {"Retry-After": "7"}), 7.0, 7.0),
        (lambda: http_response(503, b"busy", content_type="text/plain",
                               headers={"Retry-After": "2"}), 2.0, 2.0),
        (_in_30_s, 20.0, 30.0),
        (lambda: _problem(503, "HOST_BUSY", {"Retry-After": "soon"}), None, None),
        (lambda: _problem(503, "HOST_BUSY"), None, None),
    ],
    ids=["seconds", "bare-status", "http-date", "unreadable", "absent"],
)  # fmt: skip
def test_retry_after_reaches_the_caller(
    connect: Connect,
    client_world: World,
    answer: Callable[[], bytes],
    low: float | None,
    high: float | None,
) -> None:
    # A black-box test: the host's Retry-After was lost, and the client never retries itself.
    response = answer()
    with (
        canned_host(client_world.tls, lambda request: response) as host,
        pytest.raises(APIStatusError) as caught,
    ):
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q")
    waited = caught.value.retry_after
    if low is None:
        assert waited is None
    else:
        assert waited is not None and low <= waited <= (high or low)


def test_a_pool_wait_that_expires_says_nothing_was_sent() -> None:
    error = transport_error(httpx.PoolTimeout("no connection free"))
    assert isinstance(error, RetrievalHostTimeoutError)
    assert error.request_sent is False


def test_a_closed_client_raises_its_typed_error_and_sends_nothing(connect: Connect) -> None:
    api = connect()
    api.discover()  # open, it answers
    api.close()
    calls: list[Callable[[], object]] = [
        api.discover,
        lambda: api.search_context(corpus=CORPUS, query="rotate"),
        lambda: api.ingest_context(
            b"# Notes", corpus=CORPUS, source_id="closed.md", media_type="text/markdown"
        ),
        lambda: api.get_run("run_1"),
    ]
    for call in calls:
        with pytest.raises(ClientClosedError) as caught:
            call()
        assert caught.value.code == "CLIENT_CLOSED"
        assert isinstance(caught.value, RuntimeError)  # what such a call raised before
    with pytest.raises(ClientClosedError), api.stream_run(RUN) as stream:
        stream.until_done()


def test_a_client_closed_during_a_call_raises_its_typed_error(
    connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another thread or task closes the client after a call checked that it was open: httpx's
    # send then refuses with a bare RuntimeError, which becomes `ClientClosedError` too.
    api = connect()
    inner = api.client if isinstance(api, PortalClient) else api
    monkeypatch.setattr(inner, "_check_open", lambda: None)  # the check passed, then...
    api.close()  # ...the client was closed
    calls: list[Callable[[], object]] = [
        api.discover,
        lambda: api.ingest_context(
            b"# Notes", corpus=CORPUS, source_id="closed.md", media_type="text/markdown"
        ),
    ]
    for call in calls:
        with pytest.raises(ClientClosedError, match="closed during the call") as caught:
            call()
        assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(ClientClosedError), api.stream_run(RUN) as stream:
        stream.until_done()


@pytest.mark.parametrize(
    "timeout",
    [
        -1,
        0,
        "5",
        True,
        float("nan"),
        float("inf"),
        1e10,
        httpx.Timeout(-1),
        httpx.Timeout(5, connect=0),
    ],
)
def test_a_timeout_that_cannot_work_is_refused_when_the_client_is_made(
    connect: Connect, timeout: object
) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        connect(timeout=timeout)
    connect(timeout=httpx.Timeout(5, read=None)).discover()  # None: wait forever for that part


class _CountingContext(ssl.SSLContext):
    """A client TLS context that counts its handshakes (sync sockets and asyncio's BIOs)."""

    handshakes = 0

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        type(self).handshakes += 1
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        type(self).handshakes += 1
        return super().wrap_bio(*args, **kwargs)


def test_a_stream_read_to_its_end_gives_its_connection_back(
    connect: Connect, client_world: World, mode: str
) -> None:
    # httpx pools a connection only from a response read to its end: a stream closed right
    # after its terminal event would make the next call open a new connection and handshake.
    context = _CountingContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(client_world.tls.ca_file)
    _CountingContext.handshakes = 0
    api = connect(ca_bundle=context)
    api.search_context(corpus=CORPUS, query="rotate")
    note = f"# Reuse\n\nA note ingested by a streamed call ({mode}).\n".encode()
    ingested = api.ingest_context(
        note, corpus=CORPUS, source_id=f"reuse-{mode}", media_type="text/markdown"
    )
    assert ingested.status in ("indexed", "unchanged")
    api.search_context(corpus=CORPUS, query="rotate")
    with api.stream_run(RUN) as stream:
        assert stream.until_done().text
    api.search_context(corpus=CORPUS, query="rotate")
    assert _CountingContext.handshakes == 1


def test_a_run_stream_read_after_its_block_raises_client_closed(connect: Connect) -> None:
    api = connect()
    with api.stream_run(RUN) as stream:
        for event in stream:
            if event.type == "run.started":
                break
    with pytest.raises(ClientClosedError, match="block was left") as caught:
        stream.until_done()
    assert caught.value.code == "CLIENT_CLOSED"


@pytest.mark.parametrize("second", ["search", "aclose"])
def test_an_async_client_used_or_closed_from_a_second_event_loop_raises_client_closed(
    client_host: RunningHost, client_world: World, second: str
) -> None:
    # Its pooled connections belong to the first loop: httpx failed with a bare RuntimeError
    # ("Event loop is closed" once that loop had ended), and `aclose` closed them from this
    # thread while it ran. Refused, the pool is left as it was, so the client still works, and
    # closes, in its own loop, which stays alive in a portal thread.
    client = AsyncClient(
        client_host.base_url, token=client_world.tokens["admin"], ca_bundle=client_world.tls.ca_file
    )

    async def search() -> int:
        return len((await client.search_context(corpus=CORPUS, query="rotate")).hits)

    with start_blocking_portal("asyncio") as first_loop:
        try:
            assert first_loop.call(search) > 0
            with pytest.raises(ClientClosedError, match="another event loop") as caught:
                asyncio.run(search() if second == "search" else client.aclose())
            assert caught.value.code == "CLIENT_CLOSED"
            assert first_loop.call(search) > 0  # still usable where it started
        finally:
            first_loop.call(client.aclose)
    asyncio.run(client.aclose())  # closed already: nothing left to close, from any loop
    with pytest.raises(ClientClosedError, match="is closed"):
        asyncio.run(search())


def test_a_stream_kept_open_after_its_terminal_event_does_not_hold_the_call(
    connect: Connect, client_world: World
) -> None:
    # The client reads a finished stream to its end to keep the connection; a host or proxy
    # that keeps it open must not hold the call (no read deadline at all here).
    events = b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        for name, data in (STARTED, _completed(["c1"], ["c1"]))
    )
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    answer = head + b"\r\n" + b"%x\r\n%s\r\n" % (len(events), events)  # and no final chunk
    done = threading.Event()
    with canned_host(client_world.tls, lambda request: answer) as host:
        api = connect(base_url=host.base_url, timeout=httpx.Timeout(10.0, read=None))

        def run() -> None:
            with api.stream_run(RUN) as stream:
                assert stream.until_done().text == "An answer."
            done.set()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        assert done.wait(60), "the call waited on a stream its host kept open"
        worker.join()

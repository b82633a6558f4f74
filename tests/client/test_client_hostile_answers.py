"""Answers a broken or hostile host may send, and what the client makes of them (probe C,
session 40), in both modes: bodies past the client's bounds, values a newer host may add,
`Retry-After` hints no caller can wait out, and problem words meant for a terminal.

The host is the misbehaving TLS server of `canned_host.py`; an answer sent in pieces (an
endless or decompressed-bomb body) is an iterator of bytes.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from retrieval_host_client import (
    APIStatusError,
    ConflictError,
    HostBusyError,
    IndexResponse,
    ProtocolError,
    ProviderFailedError,
    RunRetrieval,
    ServiceUnavailableError,
    SourceConflictError,
    _errors,
    _responses,
    retry_after_seconds,
)
from retrieval_host_client.models import DeleteResponse, ProtocolInfo
from retrieval_host_client.run_models import RunRecord
from tests.client.canned_host import Action, Received, canned_host, http_response
from tests.client.conftest import Connect
from tests.client.modes import ClientApi
from tests.support.host import CORPUS, World

RUN = {"provider": "extractive", "model": "extractive", "input": "How do I rotate a token?"}
MIB = 1024 * 1024
# The bounds the README states.
MAX_BODY_BYTES = 64 * MIB
MAX_ERROR_BODY_BYTES = MIB
DAY = 86_400.0
# Past the bound by half: read whole, the answer below is a valid search of no hits.
OVERSIZED = MAX_BODY_BYTES + 32 * MIB


def _json(status: int, doc: object, content_type: str = "application/json") -> bytes:
    return http_response(status, json.dumps(doc).encode(), content_type=content_type)


def _problem_doc(status: int, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "urn:x", "title": "t", "status": status, "code": code, "detail": "d",
            "requestId": "0" * 32, **extra}  # fmt: skip


def _search_doc() -> bytes:
    return json.dumps({
        "hits": [], "truncated": False, "retrievedAt": "2026-01-01T00:00:00Z", "scope": None,
        "usage": {"embedding": {"requests": 1, "inputTokens": 3}},
    }).encode()  # fmt: skip


def _padded(size: int) -> Iterator[bytes]:
    """A valid search answer followed by JSON whitespace, `size` bytes in all, in 1 MiB pieces."""
    doc = _search_doc()
    yield doc
    left = size - len(doc)
    while left > 0:
        piece = min(left, MIB)
        yield b" " * piece
        left -= piece


def _declared() -> Iterator[bytes]:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {OVERSIZED}"
    yield head.encode() + b"\r\n\r\n"
    yield from _padded(OVERSIZED)


def _chunked() -> Iterator[bytes]:
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    for piece in _padded(OVERSIZED):
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


@functools.cache
def _bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    return b"".join(packer.compress(piece) for piece in _padded(OVERSIZED)) + packer.flush()


def _gzipped() -> Iterator[bytes]:
    # Sent although the client asked for `identity`: httpx decodes it all the same.
    bomb = _bomb()
    yield (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(bomb)}\r\n\r\n"
    ).encode() + bomb


@pytest.mark.parametrize("answer", [_declared, _chunked, _gzipped], ids=lambda f: f.__name__[1:])
def test_an_answer_past_the_body_bound_is_refused_however_it_is_sent(
    connect: Connect, client_world: World, answer: Callable[[], Iterator[bytes]]
) -> None:
    # Probe C: read whole with no bound, an endless answer grew the client to gigabytes, and
    # a 4 MB gzip answer to 3.85 GB. A `Content-Length` past the bound is refused unread.
    with canned_host(client_world.tls, lambda request: answer()) as host:
        api = connect(base_url=host.base_url)
        with pytest.raises(ProtocolError, match=f"larger than {MAX_BODY_BYTES} bytes"):
            api.search_context(corpus=CORPUS, query="q")


def test_the_bounds_are_the_documented_ones() -> None:
    assert _responses.MAX_BODY_BYTES == MAX_BODY_BYTES
    assert _responses.MAX_ERROR_BODY_BYTES == MAX_ERROR_BODY_BYTES
    assert _errors.MAX_RETRY_AFTER_S == DAY


def test_a_body_exactly_at_its_bound_is_read_and_one_byte_more_is_refused() -> None:
    ok = httpx.Headers()
    body = _responses.BodyReader(200, ok)
    assert body.feed(b"x" * (MAX_BODY_BYTES - 1)) is False
    assert body.feed(b"x") is False  # at the bound: read on, the body may end here
    assert len(body.body()) == MAX_BODY_BYTES
    with pytest.raises(ProtocolError, match="larger than"):
        body.feed(b"x")
    with pytest.raises(ProtocolError, match="larger than"):
        _responses.BodyReader(200, httpx.Headers({"Content-Length": str(MAX_BODY_BYTES + 1)}))
    error = _responses.BodyReader(500, httpx.Headers({"Content-Length": str(10 * MAX_BODY_BYTES)}))
    assert error.feed(b"x" * (MAX_ERROR_BODY_BYTES - 1)) is False
    assert error.feed(b"yz") is True  # cut: stop reading
    assert error.body() == b"x" * (MAX_ERROR_BODY_BYTES - 1) + b"y"


def test_the_client_asks_for_answers_without_a_content_coding(
    connect: Connect, client_world: World
) -> None:
    with canned_host(client_world.tls, lambda request: http_response(200, _search_doc())) as host:
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q")
        sent = host.received()
    assert sent[0].headers["accept-encoding"] == "identity"


def _long_problem(request: Received) -> Action:
    # A problem document whose detail alone is past the error-body bound.
    doc = _problem_doc(409, "SOURCE_CONFLICT", detail="x" * (2 * MAX_ERROR_BODY_BYTES))
    return _json(409, doc, content_type="application/problem+json")


CALLS: dict[str, Callable[[ClientApi], object]] = {
    "search": lambda api: api.search_context(corpus=CORPUS, query="q"),
    "stream_run": lambda api: api.stream_run(RUN).__enter__(),
    "ingest": lambda api: api.ingest_context(
        b"# Note\n", corpus=CORPUS, source_id="n", media_type="text/markdown"
    ),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_an_error_body_past_its_bound_is_cut_and_typed_by_its_status(
    connect: Connect, client_world: World, call: str
) -> None:
    # Cut at `MAX_ERROR_BODY_BYTES`, the document no longer parses: a 409 without its code.
    with (
        canned_host(client_world.tls, _long_problem) as host,
        pytest.raises(ConflictError) as caught,
    ):
        CALLS[call](connect(base_url=host.base_url))
    assert not isinstance(caught.value, SourceConflictError)
    assert caught.value.code == "HTTP_409"
    assert caught.value.problem is None


# --- values a newer host may add --------------------------------------------------------------

_SOURCE = {"id": "n", "revision": "r1"}
_RESULT = {
    "runId": "run_1", "status": "completed", "provider": "p", "model": "m", "text": "A.",
    "sources": [{"id": "c1", "origin": "upload", "source": _SOURCE, "location": {}}],
    "receipts": [{"sequence": 1, "query": "q", "key": "k", "startedAt": "t",
                  "status": "skipped", "sourceIds": ["c1"]}],
    "usage": {"generation": {}, "embedding": {}}, "createdAt": "t", "completedAt": "t",
}  # fmt: skip
_INFO = {
    "name": "retrieval-host", "version": "1", "capabilities": [],
    "limits": {"maxBodyBytes": 1, "maxConcurrency": 1, "headerTimeoutS": 1, "bodyTimeoutS": 1},
    "auth": {"scheme": "dpop"},
}  # fmt: skip
_CORPUS = {
    "id": CORPUS, "version": "v", "operations": ["search", "inspect"], "sources": 0,
    "passages": 0, "bytes": 0,
    "embedding": {"providerId": "p", "vendor": "v", "model": "m", "dimensions": 3,
                  "metric": "cosine"},
}  # fmt: skip
# (what the host answers, the call, what the client hands back): each value is unknown to
# protocol v1's lists, as a newer host may send it.
NEWER: dict[str, tuple[dict[str, Any], Callable[[ClientApi], Any], Callable[[Any], object]]] = {
    "index-status": (
        {"corpus": CORPUS, "source": _SOURCE, "status": "reindexed", "chunkCount": 1,
         "documentSha256": "0" * 64, "replacedRevision": None, "usage": {}},
        lambda api: api.ingest_context(b"# N\n", corpus=CORPUS, source_id="n",
                                       media_type="text/markdown", stream=False),
        lambda answer: answer.status,
    ),
    "reclamation": (
        {"corpus": CORPUS, "source": _SOURCE, "deletedChunks": 1, "reclamation": "vacuumed"},
        lambda api: api.delete_context(corpus=CORPUS, source_id="n", revision="r1"),
        lambda answer: answer.reclamation,
    ),
    "auth-scheme": (_INFO, lambda api: api.discover(), lambda answer: answer.auth.scheme),
    "run-status": (
        {"runId": "run_1", "status": "interrupted", "createdAt": "t"},
        lambda api: api.get_run("run_1"),
        lambda answer: answer.status,
    ),
    "receipt-status": (_RESULT, lambda api: api.run(RUN), lambda a: a.receipts[0].status),
    "manifest-origin": (_RESULT, lambda api: api.run(RUN), lambda a: a.sources[0].origin),
    "operation": (
        {"corpora": [_CORPUS], "writeOnly": [{"id": "w", "operations": ["index", "purge"]}]},
        lambda api: api.list_corpora(),
        lambda answer: answer[0].operations[1],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NEWER))
def test_a_value_a_newer_host_adds_reaches_the_caller_instead_of_a_protocol_error(
    connect: Connect, client_world: World, case: str
) -> None:
    # Probe C: a closed list turned a mutation the host had applied into `ProtocolError`.
    doc, call, value = NEWER[case]
    expected = {"index-status": "reindexed", "reclamation": "vacuumed", "auth-scheme": "dpop",
                "run-status": "interrupted", "receipt-status": "skipped",
                "manifest-origin": "upload", "operation": "inspect"}[case]  # fmt: skip
    with canned_host(client_world.tls, lambda request: _json(200, doc)) as host:
        answer = call(connect(base_url=host.base_url))
    assert value(answer) == expected


def test_the_open_fields_still_publish_their_known_values_and_requests_stay_closed() -> None:
    schema = IndexResponse.model_json_schema(mode="serialization")["properties"]["status"]
    assert schema["enum"] == ["indexed", "unchanged"]
    reclamation = DeleteResponse.model_json_schema()["properties"]["reclamation"]
    assert reclamation["enum"] == ["overwritten", "pending", "unknown"]
    assert (
        ProtocolInfo.model_json_schema()["$defs"]["ProtocolAuth"]["properties"]["scheme"]["const"]
        == "bearer"
    )
    assert "interrupted" not in RunRecord.model_json_schema()["properties"]["status"]["enum"]
    with pytest.raises(ValidationError):
        RunRetrieval.model_validate({"corpus": CORPUS, "mode": "sideways"})


# --- Retry-After ------------------------------------------------------------------------------


def test_a_retry_after_is_at_most_a_day_and_never_infinite() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    in_three_days = (now + timedelta(days=3)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert retry_after_seconds("9" * 400) == DAY  # was `inf`
    assert retry_after_seconds("100000") == DAY
    assert retry_after_seconds(in_three_days, now.timestamp()) == DAY
    assert retry_after_seconds("86400") == DAY
    assert retry_after_seconds("7") == 7.0


def _busy(**extra: Any) -> Callable[[Received], Action]:
    doc = _problem_doc(503, "HOST_BUSY", **extra)
    return lambda request: _json(503, doc, content_type="application/problem+json")


@pytest.mark.parametrize(
    ("respond", "expected", "waited"),
    [
        (_busy(retryAfter=-100), ServiceUnavailableError, None),
        (_busy(retryAfter=10**9), HostBusyError, DAY),
        (lambda request: http_response(503, b"busy", content_type="text/plain",
                                       headers={"Retry-After": "9" * 400}),
         ServiceUnavailableError, DAY),
    ],
    ids=["negative-in-problem", "years-in-problem", "inf-in-header"],
)  # fmt: skip
def test_a_retry_after_no_caller_could_wait_is_not_passed_on(
    connect: Connect,
    client_world: World,
    respond: Callable[[Received], Action],
    expected: type[APIStatusError],
    waited: float | None,
) -> None:
    # A negative `retryAfter` makes the problem invalid: the error is typed by its status.
    with (
        canned_host(client_world.tls, respond) as host,
        pytest.raises(APIStatusError) as caught,
    ):
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q")
    assert type(caught.value) is expected
    assert caught.value.retry_after == waited


def test_a_failed_runs_retry_after_is_at_most_a_day(connect: Connect, client_world: World) -> None:
    # A stream's `run.failed` has no headers: the problem's own `retryAfter` is the hint.
    failed = _failed_run(connect, client_world, retryAfter=10**9)
    assert failed.retry_after == DAY


# --- words for a terminal ---------------------------------------------------------------------


def test_a_problems_control_characters_are_escaped_in_the_error_message(
    connect: Connect, client_world: World
) -> None:
    detail = "first line\nforged line \x1b[2J\x1b[31mred\u202e"
    doc = _problem_doc(409, "SOURCE_CONFLICT", detail=detail, requestId="r\x07")
    answer = _json(409, doc, content_type="application/problem+json")
    with (
        canned_host(client_world.tls, lambda request: answer) as host,
        pytest.raises(SourceConflictError) as caught,
    ):
        connect(base_url=host.base_url).search_context(corpus=CORPUS, query="q")
    message = str(caught.value)
    assert message.isprintable(), message
    assert "first line\\nforged line \\x1b[2J" in message
    assert "[request r\\x07]" in message
    assert caught.value.detail == detail  # the problem itself is kept as the host said it


def test_a_failed_runs_retry_after_is_seconds_as_a_float(
    connect: Connect, client_world: World
) -> None:
    # Probe G, session 42: `retry_after` was 3.0 from a header and 3 from a stream's problem.
    failed = _failed_run(connect, client_world, retryAfter=3)
    assert failed.retry_after == 3.0 and type(failed.retry_after) is float


def _failed_run(connect: Connect, client_world: World, **fields: Any) -> ProviderFailedError:
    """What a stream whose run failed `PROVIDER_FAILED` with these problem `fields` raises."""
    problem = _problem_doc(502, "PROVIDER_FAILED", **fields)
    started = {"type": "run.started", "runId": "run_1", "createdAt": "t"}
    failed = {"type": "run.failed", "runId": "run_1", "problem": problem}
    body = b"".join(
        f"event: {d['type']}\ndata: {json.dumps(d)}\n\n".encode() for d in (started, failed)
    )
    answer = http_response(200, body, content_type="text/event-stream", close=True)
    with canned_host(client_world.tls, lambda request: answer) as host:
        api = connect(base_url=host.base_url)
        with pytest.raises(ProviderFailedError) as caught, api.stream_run(RUN) as stream:
            stream.until_done()
    return caught.value

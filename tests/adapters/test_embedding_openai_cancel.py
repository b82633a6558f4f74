"""OpenAIEmbedding stops a request when its caller's token says so, and bounds it as a whole.

A black-box probe found a cancelled index waiting out a 6 s embedding call, an inactivity timeout
of 1 s passing a 6 s call (the progress recorded after the batch reset the clock it overran), and
a service dripping its answer holding the call without end. These run against the real loopback
server (`FakeOpenAI`, also over TLS) whose "slow" mode stays silent until it answers, as an
embedding service does while it computes a batch.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import trustme

from retrieval_host.adapters import _openai_http
from retrieval_host.adapters.embedding_openai import OpenAIEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.reasons import EmbeddingFailedReason, TimeoutReason
from retrieval_host.core.service import Corpus, RetrievalService
from tests.support.adapter_factory import closing_factory
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    EMBEDDINGS_PATH,
    FakeOpenAI,
    RecordedRequest,
    Reply,
    fake_token_count,
    fake_vector,
)
from tests.support.fake_openai import _embeddings as answer_embeddings
from tests.support.host import wait_until

MODEL = "text-embedding-3-small"
DIMS = 64
TEXTS = ["alpha passage", "beta passage", "gamma passage"]
# What the slow server would take: every bound below is a small fraction of it.
SERVER_DELAY_S = 20.0
# A generous ceiling for "at once" on a loaded two-core machine (the watchdog polls each 50 ms).
PROMPT_S = 5.0

DESCRIPTOR = EmbeddingDescriptor(
    provider_id="openai-main",
    vendor="openai",
    account_id="research-account",
    auth_mode="api-key",
    model=MODEL,
    dimensions=DIMS,
)


@pytest.fixture(params=["http", "https"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FakeOpenAI, object]]:
    """The fake server and what the adapter passes as `verify` for it: plain HTTP, and TLS
    (where the watchdog shuts down the socket under an `SSLSocket`)."""
    if request.param == "http":
        with FakeOpenAI() as server:
            yield server, True
        return
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    with FakeOpenAI(tls=context) as server:
        yield server, str(bundle)


Factory = Callable[..., OpenAIEmbedding]


@pytest.fixture
def make(served: tuple[FakeOpenAI, object]) -> Iterator[Factory]:
    server, verify = served
    with closing_factory(
        OpenAIEmbedding,
        descriptor=DESCRIPTOR,
        base_url=server.base_url,
        api_key=lambda: DEFAULT_API_KEY,
        verify=verify,
        timeout_s=60.0,
    ) as factory:
        yield factory


@pytest.fixture
def server(served: tuple[FakeOpenAI, object]) -> FakeOpenAI:
    """The server of `served`, in place of the conftest's plain-HTTP one."""
    return served[0]


def watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "http-watchdog"]


def embed_failure(adapter: OpenAIEmbedding, cancel: CancelToken) -> tuple[RetrievalError, float]:
    """The error `embed` raises and how long it took."""
    started = time.monotonic()
    with pytest.raises(RetrievalError) as info:
        adapter.embed(TEXTS, cancel)
    return info.value, time.monotonic() - started


def cancel_once_received(
    server: FakeOpenAI, token: CancelToken, count: int = 1
) -> threading.Thread:
    """Cancel `token` as soon as the server has `count` embedding requests (so mid-call)."""

    def run() -> None:
        wait_until(lambda: server.embedding_requests_count >= count, what="the embedding request")
        token.cancel()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_cancel_stops_a_silent_slow_request_at_once_and_the_adapter_stays_usable(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("slow", delay_s=SERVER_DELAY_S)
    adapter = make()
    token = CancelToken()
    canceller = cancel_once_received(server, token)

    error, elapsed = embed_failure(adapter, token)
    canceller.join()

    assert error.code is ErrorCode.CANCELLED
    assert elapsed < PROMPT_S
    assert server.embedding_requests_count == 1  # nothing retried
    wait_until(lambda: not watchdogs(), what="the watchdog to stop")
    # The next request gets a connection of its own and succeeds.
    server.set_mode("ok")
    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1


def connections(server: FakeOpenAI) -> int:
    """How many connections the server's embedding requests came over."""
    return len({r.peer for r in server.requests if r.path == EMBEDDINGS_PATH})


def wait_idle_past_lane_idle_time(since: float) -> None:
    """Poll the clock until more than `LANE_IDLE_S` has passed since `since` (monotonic)."""
    wait_until(
        lambda: time.monotonic() - since > _openai_http.LANE_IDLE_S,
        what="LANE_IDLE_S to pass",
    )


def test_calls_in_turn_keep_one_connection_alive(server: FakeOpenAI, make: Factory) -> None:
    """Each call has a watchdog, and still no call pays for a connection (and a TLS
    handshake: 7.8 ms against 3.1 ms on loopback) when the one before it left one open."""
    adapter = make()
    for _ in range(5):
        assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1

    assert server.embedding_requests_count == 5
    assert connections(server) == 1


def test_a_cancel_stops_a_slow_request_on_a_kept_alive_connection(
    server: FakeOpenAI, make: Factory
) -> None:
    """The watchdog knows the socket of a connection it did not see made."""
    adapter = make()
    adapter.embed(TEXTS, CancelToken())  # leaves its connection open for the next call
    server.set_mode("slow", after=1, delay_s=SERVER_DELAY_S)
    token = CancelToken()
    canceller = cancel_once_received(server, token, count=2)

    error, elapsed = embed_failure(adapter, token)
    canceller.join()

    assert error.code is ErrorCode.CANCELLED
    assert elapsed < PROMPT_S
    assert connections(server) == 1  # the slow request went over the kept-alive connection
    wait_until(lambda: not watchdogs(), what="the watchdog to stop")
    server.set_mode("ok")
    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1
    assert connections(server) == 2  # the connection it shut down is not reused


def test_overlapping_calls_get_connections_of_their_own(server: FakeOpenAI, make: Factory) -> None:
    """A call made while another waits on its service is not queued behind it, and the cancel
    of the waiting one leaves the other's connection alone."""
    server.set_mode("slow", delay_s=SERVER_DELAY_S)
    adapter = make()
    token = CancelToken()
    codes: list[ErrorCode] = []

    def slow_call() -> None:
        try:
            adapter.embed(TEXTS, token)
        except RetrievalError as error:
            codes.append(error.code)

    slow = threading.Thread(target=slow_call)
    slow.start()
    wait_until(lambda: server.embedding_requests_count == 1, what="the slow request")
    server.set_mode("ok")

    started = time.monotonic()
    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1
    assert time.monotonic() - started < PROMPT_S  # not after the slow call's 20 s
    token.cancel()
    slow.join()

    assert codes == [ErrorCode.CANCELLED]
    assert connections(server) == 2
    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1  # a lane of each still works


def test_a_call_its_kept_alive_connection_loses_after_the_service_read_it_is_sent_once(
    server: FakeOpenAI, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probe B (session 39): a service that read the whole call on a kept-alive connection,
    then closed it without answering, was sent the call again on a new connection: it embedded
    (and billed) the batch twice, metered as one request. A call is sent once, always."""
    # However loaded the machine, the second call must find the first one's connection.
    monkeypatch.setattr(_openai_http, "LANE_IDLE_S", 60.0)

    def drop_the_second(server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        return Reply(drop=True) if number == 2 else answer_embeddings(server, request, number)

    server.route("POST", EMBEDDINGS_PATH, drop_the_second)
    adapter = make()
    adapter.embed(TEXTS, CancelToken())
    error, _ = embed_failure(adapter, CancelToken())

    assert (error.code, error.reason) == (
        ErrorCode.EMBEDDING_FAILED,
        EmbeddingFailedReason.CONNECTION_FAILED,
    )
    assert server.embedding_requests_count == 2  # the dropped call reached the service once
    assert connections(server) == 1  # over the kept-alive connection
    # The adapter goes on, on a new connection.
    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1
    assert (server.embedding_requests_count, connections(server)) == (3, 2)

    server.set_mode("drop-connection")
    server.route("POST", EMBEDDINGS_PATH, answer_embeddings)
    error, _ = embed_failure(make(), CancelToken())
    assert error.reason == EmbeddingFailedReason.CONNECTION_FAILED
    assert server.embedding_requests_count == 4  # a new connection's failure: once too


def test_a_connection_idle_past_the_lane_idle_time_is_not_reused(
    server: FakeOpenAI, make: Factory
) -> None:
    """Not being sent twice, a call must not go out on a connection the service may be closing
    for its keep-alive timeout (review V: 2-8 of 150 calls near it failed). The shipped idle
    time is below gunicorn's 2 s, the shortest common default."""
    assert _openai_http.LANE_IDLE_S <= 1.0
    adapter = make()
    adapter.embed(TEXTS, CancelToken())
    wait_idle_past_lane_idle_time(time.monotonic())  # the lane was returned before this

    assert adapter.embed(TEXTS, CancelToken()).usage.requests == 1
    assert connections(server) == 2
    wait_until(lambda: server.open_connections == 1, what="the idle lane's connection to close")


def test_a_lanes_client_reuses_no_connection_idle_past_the_lane_idle_time(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx's own keep-alive expiry in a lane is the same bound, so no layer reuses one."""
    monkeypatch.setattr(_openai_http, "LANE_IDLE_S", 0.2)
    lanes = _openai_http.ClientLanes(
        timeout=httpx.Timeout(30.0),
        verify=False,  # the TLS fake's CA is not what this test is about
        headers={"Authorization": f"Bearer {DEFAULT_API_KEY}"},
    )
    url = server.base_url + "/embeddings"
    body = {"model": MODEL, "input": TEXTS}
    try:
        with lanes.lane() as lane:  # one lane throughout: only httpx decides on reuse
            assert lane.client.post(url, json=body).status_code == 200
            wait_idle_past_lane_idle_time(time.monotonic())  # the response is closed
            assert lane.client.post(url, json=body).status_code == 200
    finally:
        lanes.close()
    assert (server.embedding_requests_count, connections(server)) == (2, 2)


def test_lanes_idle_past_the_keep_alive_expiry_are_closed_at_the_next_call(
    server: FakeOpenAI, make: Factory
) -> None:
    """Review V: after a burst, every lane's connection stayed open (in CLOSE_WAIT once the
    service closed it) while calls one at a time reused only the last one returned."""
    gate = threading.Event()

    def held(server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        gate.wait(timeout=60)  # until all three calls are in: they overlap
        return answer_embeddings(server, request, number)

    server.route("POST", EMBEDDINGS_PATH, held)
    adapter = make()
    calls = [threading.Thread(target=adapter.embed, args=(TEXTS, CancelToken())) for _ in "abc"]
    for call in calls:
        call.start()
    wait_until(lambda: server.embedding_requests_count == 3, what="three overlapping calls")
    gate.set()
    for call in calls:
        call.join()
    assert server.open_connections == 3  # each lane keeps its connection

    wait_idle_past_lane_idle_time(time.monotonic())
    adapter.embed(TEXTS, CancelToken())
    wait_until(lambda: server.open_connections == 1, what="the idle lanes to close")


def test_an_idle_timeout_shorter_than_one_slow_batch_fails_with_the_idle_timeout(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("slow", delay_s=SERVER_DELAY_S)

    error, elapsed = embed_failure(make(), CancelToken(idle_timeout_s=0.5))

    assert (error.code, error.reason) == (ErrorCode.TIMEOUT, TimeoutReason.IDLE_TIMEOUT)
    assert 0.5 <= elapsed < PROMPT_S
    assert server.embedding_requests_count == 1


def _dripping_embeddings(server: FakeOpenAI, request: RecordedRequest, _: int) -> Reply:
    """A right answer, one byte every 20 ms: no read ever waits long, the whole takes minutes."""
    texts = request.json["input"]
    doc = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": fake_vector(MODEL, t, 1536, DIMS)}
            for i, t in enumerate(texts)
        ],
        "model": MODEL,
        "usage": {"prompt_tokens": sum(fake_token_count(t) for t in texts)},
    }
    body = json.dumps(doc).encode("utf-8")
    assert len(body) * 0.02 > 60  # the whole answer would take over a minute

    def drip() -> Iterator[bytes]:
        for i in range(len(body)):
            yield body[i : i + 1]
            server.wait(0.02)  # the service's pace, not the test's synchronisation

    return Reply(200, stream=drip())


def test_a_service_dripping_its_answer_is_cut_at_the_total_bound(
    server: FakeOpenAI, make: Factory
) -> None:
    server.route("POST", EMBEDDINGS_PATH, _dripping_embeddings)

    error, elapsed = embed_failure(make(timeout_s=1.0), CancelToken())

    assert (error.code, error.reason) == (
        ErrorCode.EMBEDDING_FAILED,
        EmbeddingFailedReason.TIMEOUT,
    )
    assert 1.0 <= elapsed < 1.0 + PROMPT_S
    assert DEFAULT_API_KEY not in error.detail
    assert server.embedding_requests_count == 1

    token = CancelToken()
    canceller = cancel_once_received(server, token)
    error, elapsed = embed_failure(make(timeout_s=60.0), token)
    canceller.join()
    assert error.code is ErrorCode.CANCELLED
    assert elapsed < PROMPT_S


def test_slow_batches_each_within_the_idle_timeout_succeed_though_together_they_exceed_it(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("slow", delay_s=0.25)
    texts = [f"passage number {i}" for i in range(8)]
    idle_s = 1.5
    started = time.monotonic()

    batch = make(max_batch_inputs=1, timeout_s=5.0).embed(texts, CancelToken(idle_s))

    assert time.monotonic() - started > idle_s  # only progress between batches kept it alive
    assert batch.usage.requests == len(texts) == server.embedding_requests_count
    want = np.array([fake_vector(MODEL, t, 1536, DIMS) for t in texts], dtype=np.float32)
    np.testing.assert_allclose(batch.vectors, want, atol=1e-6)
    wait_until(lambda: not watchdogs(), what="the watchdogs to stop")


# --- through RetrievalService with the real SQLite store (the probe's scenario) ---------------

CORPUS = "handbook"
NAMESPACE = "tenant-a"
CHUNKS = [ChunkInput(f"doc-1#{i}", text, Location(page=i + 1)) for i, text in enumerate(TEXTS)]
INDEX = IndexRequest(CORPUS, SourceInfo("doc-1", "r1", "Handbook"), CHUNKS)


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    return Grant(NAMESPACE, {"doc-1": ANY_REVISION})


@pytest.mark.parametrize("stop", ["cancel", "idle-timeout"])
def test_an_index_whose_embedding_stalls_stops_at_once_and_stores_nothing(
    server: FakeOpenAI, make: Factory, tmp_path: Path, stop: str
) -> None:
    server.set_mode("slow", delay_s=SERVER_DELAY_S)
    token = CancelToken(idle_timeout_s=0.5 if stop == "idle-timeout" else None)
    canceller = cancel_once_received(server, token) if stop == "cancel" else None
    with SqliteVectorStore.open(tmp_path / "corpora.db") as store:
        corpus = Corpus(
            CORPUS, "passages-v1", make(), store, authorize, chunking={"context": "none"}
        )
        service = RetrievalService([corpus], query_cache_entries=0)
        started = time.monotonic()
        with pytest.raises(RetrievalError) as info:
            service.index_context(INDEX, RequestContext("alice", cancel=token))
        elapsed = time.monotonic() - started
        if canceller is not None:
            canceller.join()

        if stop == "cancel":
            assert info.value.code is ErrorCode.CANCELLED
        else:
            assert (info.value.code, info.value.reason) == (
                ErrorCode.TIMEOUT,
                TimeoutReason.IDLE_TIMEOUT,
            )
        assert elapsed < PROMPT_S
        server.set_mode("ok")
        again = service.index_context(INDEX, RequestContext("alice"))
    assert again.status == "indexed"  # the stopped attempt left nothing behind

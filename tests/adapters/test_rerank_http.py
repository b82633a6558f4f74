"""The `/rerank` adapter against a real loopback server that speaks the format and misbehaves
on demand: every defect is a typed `RERANK_FAILED`, the key never shows, nothing is retried."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from retrieval_host.adapters import _openai_http
from retrieval_host.adapters.rerank_http import HttpReranker
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import RerankDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Location, RerankUsage
from retrieval_host.core.ports import Candidate
from retrieval_host.core.reasons import InvalidRequestReason, RerankFailedReason
from retrieval_host.core.rerank import rerank_candidates
from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.fake_rerank import RERANK_MODEL, RERANK_PATH, FakeReranker, RerankMode
from tests.support.host import wait_until

DESCRIPTOR = RerankDescriptor("rerank-http", "cohere", "acct-1", "api-key", RERANK_MODEL)
DOCS = [
    "Invoices are due in thirty days.",
    "Sea otters hold hands while they sleep.",
    "Otters sleep in kelp forests.",
]
QUERY = "do otters sleep holding hands"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    """One server for the module, in place of the conftest's one per test (`fake` resets it)."""
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def fake(server: FakeOpenAI) -> FakeReranker:
    server.reset()
    return FakeReranker(server)


def adapter_for(fake: FakeReranker, **options: Any) -> HttpReranker:
    """An adapter for the fake with the right key, unless `options` say otherwise."""
    return HttpReranker(
        **{"descriptor": DESCRIPTOR, "api_key": lambda: DEFAULT_API_KEY, **options},
        base_url=fake.base_url,
    )


@pytest.fixture
def reranker(fake: FakeReranker) -> Iterator[HttpReranker]:
    with adapter_for(fake) as adapter:
        yield adapter


def candidates(texts: list[str]) -> list[Candidate]:
    return [
        Candidate(f"c{i}", "s", "r1", t, Location(start_line=i + 1, end_line=i + 1), "0" * 64, 0.5)
        for i, t in enumerate(texts)
    ]


def test_it_sends_the_wire_format_and_reorders_by_relevance(
    fake: FakeReranker, reranker: HttpReranker
) -> None:
    ranked, scores, usage = rerank_candidates(reranker, QUERY, candidates(DOCS), CancelToken())

    assert [c.chunk_id for c in ranked] == ["c1", "c2", "c0"]
    # Three of the query's five words in c1, two in c2, none in c0.
    assert scores == {"c1": 0.6, "c2": 0.4, "c0": 0.0}
    assert [c.score for c in ranked] == [0.6, 0.4, 0.0]
    (body,) = fake.requests
    assert body == {
        "model": RERANK_MODEL,
        "query": QUERY,
        "documents": DOCS,
        "top_n": 3,
        "return_documents": False,
    }
    # Usage: one call, three documents, and the tokens the service reported.
    assert usage == RerankUsage(requests=1, documents=3, input_tokens=23)


def test_a_tei_style_bare_list_is_read_too(fake: FakeReranker, reranker: HttpReranker) -> None:
    fake.set_mode("tei-list")
    batch = reranker.rerank(QUERY, DOCS, 3, CancelToken())
    assert sorted((r.index, r.relevance_score) for r in batch.results) == [
        (0, 0.0),
        (1, 0.6),
        (2, 0.4),
    ]
    assert batch.usage == RerankUsage(requests=1, documents=3, input_tokens=0)


def test_results_in_any_order_are_placed_by_index(
    fake: FakeReranker, reranker: HttpReranker
) -> None:
    fake.set_mode("ascending")
    ranked, _, _ = rerank_candidates(reranker, QUERY, candidates(DOCS), CancelToken())
    assert [c.chunk_id for c in ranked] == ["c1", "c2", "c0"]


REJECTIONS: list[tuple[RerankMode, RerankFailedReason]] = [
    ("too-few", RerankFailedReason.WRONG_COUNT),
    ("too-many", RerankFailedReason.WRONG_COUNT),
    ("duplicate-index", RerankFailedReason.DUPLICATE_INDEX),
    ("out-of-range", RerankFailedReason.INDEX_OUT_OF_RANGE),
    ("negative-index", RerankFailedReason.INDEX_OUT_OF_RANGE),
    ("nan", RerankFailedReason.NON_FINITE_SCORE),
    ("infinity", RerankFailedReason.NON_FINITE_SCORE),
    ("huge-integer", RerankFailedReason.NON_FINITE_SCORE),
    ("string-score", RerankFailedReason.MALFORMED_RESPONSE),
    ("bool-index", RerankFailedReason.MALFORMED_RESPONSE),
    ("no-results", RerankFailedReason.MALFORMED_RESPONSE),
    ("malformed-json", RerankFailedReason.MALFORMED_RESPONSE),
    ("server-error", RerankFailedReason.HTTP_ERROR),
    ("rate-limited", RerankFailedReason.RATE_LIMITED),
    ("drop-connection", RerankFailedReason.CONNECTION_FAILED),
]


@pytest.mark.parametrize(("mode", "reason"), REJECTIONS, ids=[m for m, _ in REJECTIONS])
def test_every_defect_is_a_typed_failure_after_one_request(
    fake: FakeReranker, reranker: HttpReranker, mode: RerankMode, reason: RerankFailedReason
) -> None:
    fake.set_mode(mode)
    with pytest.raises(RetrievalError) as caught:
        rerank_candidates(reranker, QUERY, candidates(DOCS), CancelToken())
    assert caught.value.code is ErrorCode.RERANK_FAILED
    assert caught.value.status == 502
    assert caught.value.reason == reason
    assert len(fake.requests) == 1  # never retried


def test_a_call_its_kept_alive_connection_loses_after_the_service_read_it_is_sent_once(
    server: FakeOpenAI, fake: FakeReranker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probe B (session 39): a reranker that read the call on a kept-alive connection and
    closed it without answering was asked again on a new one, scoring (and billing) it twice
    while usage counted one request."""
    # However loaded the machine, the second call must find the first one's connection.
    monkeypatch.setattr(_openai_http, "LANE_IDLE_S", 60.0)
    with adapter_for(fake) as reranker:
        reranker.rerank(QUERY, DOCS, 3, CancelToken())
        fake.set_mode("drop-connection")
        with pytest.raises(RetrievalError) as caught:
            reranker.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.code is ErrorCode.RERANK_FAILED
    assert caught.value.reason == RerankFailedReason.CONNECTION_FAILED
    assert len(fake.requests) == 2  # the dropped call reached the service once
    assert len({r.peer for r in server.requests if r.path == RERANK_PATH}) == 1  # kept alive


def test_a_server_that_echoes_the_key_does_not_get_it_into_the_error(
    fake: FakeReranker, reranker: HttpReranker
) -> None:
    fake.set_mode("server-error-echo-key")
    with pytest.raises(RetrievalError) as caught:
        reranker.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == RerankFailedReason.HTTP_ERROR
    assert DEFAULT_API_KEY not in caught.value.detail
    assert "HTTP 500" in caught.value.detail


def test_a_slow_service_times_out_as_a_typed_failure(fake: FakeReranker) -> None:
    fake.set_mode("slow", delay_s=30)
    adapter = adapter_for(fake, timeout_s=0.5)
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == RerankFailedReason.TIMEOUT


def _cancel_once_sent(fake: FakeReranker, token: CancelToken) -> threading.Thread:
    """A started thread that cancels `token` once the fake has received one more request."""
    calls = len(fake.requests)

    def cancel_once_sent() -> None:
        wait_until(lambda: len(fake.requests) > calls, what="the rerank request")
        token.cancel()

    canceller = threading.Thread(target=cancel_once_sent)
    canceller.start()
    return canceller


def test_a_service_dripping_its_answer_times_out_within_the_total_and_stops_on_cancel(
    fake: FakeReranker,
) -> None:
    """A byte every 50 ms never trips a per-read timeout: a black-box test's search read such
    a reranker for 197 s after its client had left. `timeout_s` bounds the whole answer, and
    the search's cancel token is checked as it arrives."""
    fake.set_mode("drip", delay_s=0.05)  # the whole answer would take over 200 s
    adapter = adapter_for(fake, timeout_s=1.0)
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == RerankFailedReason.TIMEOUT
    token = CancelToken()
    canceller = _cancel_once_sent(fake, token)
    adapter = adapter_for(fake, timeout_s=60.0)
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, token)
    canceller.join()
    assert caught.value.code is ErrorCode.CANCELLED


def test_a_search_cancelled_while_the_service_computes_stops_at_once(fake: FakeReranker) -> None:
    """A reranker says nothing until its answer is ready: checks between body chunks left a
    cancelled search waiting out the whole call (session 37, after probe C found the same in
    the embedding adapter). The call's socket is shut down and `CANCELLED` raised."""
    fake.set_mode("slow", delay_s=30)
    token = CancelToken()
    calls = len(fake.requests)
    canceller = _cancel_once_sent(fake, token)
    adapter = adapter_for(fake, timeout_s=60.0)
    started = time.monotonic()
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, token)
    canceller.join()
    assert caught.value.code is ErrorCode.CANCELLED
    assert time.monotonic() - started < 15  # not the service's 30 s
    assert len(fake.requests) == calls + 1  # and not asked again


def test_a_wrong_key_is_an_http_error_that_names_no_key(fake: FakeReranker) -> None:
    adapter = adapter_for(fake, api_key=lambda: "sk-wrong-key-123456789")
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == RerankFailedReason.HTTP_ERROR
    assert "sk-wrong-key" not in caught.value.detail


def test_an_unreadable_key_fails_before_any_request(fake: FakeReranker) -> None:
    def broken() -> str:
        raise OSError("no key file")

    adapter = adapter_for(fake, api_key=broken)
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == RerankFailedReason.API_KEY_UNAVAILABLE
    assert fake.requests == []


def test_a_cancelled_request_sends_nothing(fake: FakeReranker, reranker: HttpReranker) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(RetrievalError) as caught:
        rerank_candidates(reranker, QUERY, candidates(DOCS), token)
    assert caught.value.code is ErrorCode.CANCELLED
    assert fake.requests == []


@pytest.mark.parametrize(
    ("base_url", "auth_mode", "with_key"),
    [
        ("ftp://127.0.0.1/v1", "api-key", True),
        ("https://user:pw@example.test/v1", "api-key", True),
        ("https://example.test/v1", "none", True),
        ("https://example.test/v1", "api-key", False),
    ],
)
def test_a_bad_configuration_is_refused_at_construction(
    base_url: str, auth_mode: str, with_key: bool
) -> None:
    descriptor = RerankDescriptor("rerank-http", "cohere", "acct-1", auth_mode, RERANK_MODEL)  # type: ignore[arg-type]
    with pytest.raises(RetrievalError) as caught:
        HttpReranker(
            descriptor=descriptor,
            base_url=base_url,
            api_key=(lambda: DEFAULT_API_KEY) if with_key else None,
        )
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert caught.value.reason == InvalidRequestReason.RERANK_CONFIG


def test_more_documents_than_configured_is_refused_without_a_request(fake: FakeReranker) -> None:
    adapter = adapter_for(fake, max_documents=2)
    with adapter, pytest.raises(RetrievalError) as caught:
        adapter.rerank(QUERY, DOCS, 3, CancelToken())
    assert caught.value.reason == InvalidRequestReason.RERANK_CONFIG
    assert fake.requests == []

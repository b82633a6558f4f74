"""Reranking end to end: `retrieval-host serve` with the example application configured with
`applicationOptions.reranker`, a real `/rerank` server on loopback, searches and runs over
HTTPS. The reranker's key comes from the environment and never shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.fake_rerank import RERANK_MODEL, FakeReranker
from tests.support.observability import CORPUS, HostProcess, host_process

PASSAGES = [
    "Sea otters hold hands while they sleep.",
    "Otters use rocks as tools to open shells.",
    "Kelp forests shelter many animals.",
    "The invoice is due within thirty days.",
    "Otters sleep in kelp, the invoice notes.",
]
QUERY = "otters sleep holding hands"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeReranker]:
    with FakeOpenAI() as server:
        yield FakeReranker(server)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, fake: FakeReranker) -> Iterator[HostProcess]:
    reranker = {
        "baseUrl": fake.base_url,
        "model": RERANK_MODEL,
        "vendor": "cohere",
        "apiKey": {"env": "RERANK_API_KEY"},
        "candidates": 4,
    }
    with host_process(
        tmp_path_factory.mktemp("rerank") / "host",
        subjects={"writer": ["local"]},
        providers={"local": {"kind": "extractive"}},
        application_options={"reranker": reranker},
        environ={"RERANK_API_KEY": DEFAULT_API_KEY},
    ) as running:
        with running.client("writer") as writer:
            indexed = writer.post(
                "/v1/retrieval/index",
                json={
                    "corpus": CORPUS,
                    "source": {"id": "notes", "revision": "r1"},
                    "chunks": [{"id": f"n-{i}", "text": t} for i, t in enumerate(PASSAGES)],
                },
            )
            assert indexed.status_code == 200, indexed.text
        yield running


@pytest.fixture
def writer(host: HostProcess, fake: FakeReranker) -> Iterator[httpx.Client]:
    fake.reset()
    with host.client("writer") as client:
        yield client


def search(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/v1/retrieval/search", json={"corpus": CORPUS, "query": QUERY, **fields})


def test_a_search_is_reranked_and_shows_each_score_and_the_usage(
    writer: httpx.Client, fake: FakeReranker
) -> None:
    response = search(writer, limit=3)
    assert response.status_code == 200, response.text
    body = response.json()
    hits = body["hits"]
    assert [h["chunkId"] for h in hits][:1] == ["n-0"]  # three of the four words
    assert [h["score"] for h in hits] == [h["scores"]["rerank"] for h in hits]
    assert all(h["scores"]["dense"] is not None or h["scores"]["lexical"] is not None for h in hits)
    assert body["usage"]["rerank"]["requests"] == 1
    assert body["usage"]["rerank"]["documents"] == 4
    (sent,) = fake.requests
    assert sent["model"] == RERANK_MODEL and len(sent["documents"]) == 4

    plain = search(writer, rerank=False).json()
    assert all(h["scores"]["rerank"] is None for h in plain["hits"])
    assert plain["usage"]["rerank"] == {"requests": 0, "documents": 0, "inputTokens": 0}
    assert len(fake.requests) == 1


def test_a_misbehaving_reranker_is_a_typed_502_without_the_key(
    writer: httpx.Client, fake: FakeReranker
) -> None:
    for mode, reason in (("duplicate-index", "duplicate-index"), ("nan", "non-finite-score")):
        fake.set_mode(mode)  # type: ignore[arg-type]
        response = search(writer)
        assert response.status_code == 502, response.text
        problem = response.json()
        assert (problem["code"], problem["reason"]) == ("RERANK_FAILED", reason)
    fake.set_mode("server-error-echo-key")
    response = search(writer)
    assert response.json()["reason"] == "http-error"
    assert DEFAULT_API_KEY not in response.text
    fake.set_mode("ok")
    assert search(writer).status_code == 200  # the host serves on


def test_a_run_draws_reranker_calls_on_its_budget_and_counts_them(
    writer: httpx.Client, fake: FakeReranker
) -> None:
    run: dict[str, Any] = {
        "provider": "local",
        "model": "extractive",
        "input": QUERY,
        "retrieval": {"corpus": CORPUS, "mode": "before"},
    }
    done = writer.post("/v1/runs", json=run)
    assert done.status_code == 200, done.text
    result = done.json()
    assert result["usage"]["rerank"]["requests"] == 1
    # A run searches with limit 6: limit + 1 is more than the corpus's 4 candidates, and more
    # than the 5 passages it holds.
    assert result["usage"]["rerank"]["documents"] == len(PASSAGES)
    assert len(fake.requests) == 1

    run["retrieval"]["maxRerankCalls"] = 0
    spent = writer.post("/v1/runs", json=run)
    # The one search would have called the reranker past the budget: it was not made.
    assert spent.status_code == 422, spent.text
    assert spent.json()["code"] == "NO_RETRIEVAL_EVIDENCE"
    assert len(fake.requests) == 1


def test_the_reranker_is_pinned_in_the_corpus_descriptor(tmp_path: Path) -> None:
    # A store made with one reranker does not open with another model: another index version.
    with FakeOpenAI() as server:
        fake = FakeReranker(server)
        options: dict[str, Any] = {"reranker": {"baseUrl": fake.base_url, "model": RERANK_MODEL}}
        with host_process(
            tmp_path / "host", subjects={"writer": []}, application_options=options
        ) as first:
            with first.client("writer") as client:
                assert search(client).status_code == 200
            first.terminate()
        options["reranker"]["model"] = "rerank-multilingual-v3.0"
        with host_process(
            tmp_path / "host",
            subjects={"writer": []},
            application_options=options,
            wait_ready=False,
        ) as second:
            assert second.process.wait(timeout=120) != 0
            assert "reranking.model" in second.log_text()

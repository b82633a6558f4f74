"""Searches that call no model run on the event loop (`limits.inlineSearchMs`), over real HTTPS.

The host world's query cache is off, so its hybrid searches always call the model: only
lexical searches qualify here (cached query vectors: `tests/contract/test_service_inline.py`).
Where each search ran is read from the thread that called the driver: the host's event loop
runs on the thread `serve_in_thread` names "test-host", search threads are "search-work-*".
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import SearchRequest, SearchResult
from retrieval_host.http.inline import InlineSearches
from tests.support.host import CORPUS, RunningHost, World, serve_in_thread, wait_until

LEXICAL = {"corpus": CORPUS, "query": "rotate a token", "mode": "lexical"}
HYBRID = {"corpus": CORPUS, "query": "rotate a token"}
LOOP = "test-host"


@pytest.fixture
def threads_seen(host_world: World, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each search of the host world's driver ran on, in order."""
    seen: list[str] = []
    search = host_world.driver.search_context

    def recorded(request: SearchRequest, context: RequestContext) -> SearchResult:
        seen.append(threading.current_thread().name)
        return search(request, context)

    monkeypatch.setattr(host_world.driver, "search_context", recorded)
    return seen


def _inline(host: RunningHost) -> InlineSearches:
    inline = host.app.routes.policy._inline
    assert inline is not None, "the host has no inline searches"
    return inline


def _on_loop(host: RunningHost) -> float:
    value = host.app.metrics.registry.get_sample_value(
        "retrieval_host_searches_on_loop_total", {"corpus": CORPUS}
    )
    return 0.0 if value is None else value


def _search(host: RunningHost, token: str, body: dict[str, Any]) -> list[str]:
    with host.client() as client:
        response = client.post(
            "/v1/retrieval/search", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    assert response.status_code == 200, response.text
    return [hit["chunkId"] for hit in response.json()["hits"]]


def test_a_corpus_first_search_runs_on_a_thread_then_the_loop_takes_short_ones(
    host_world: World, threads_seen: list[str]
) -> None:
    settings = host_world.settings(limits={"searchThreads": 1, "inlineSearchMs": 50})
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        first = _search(host, alice, LEXICAL)
        after = [_search(host, alice, LEXICAL) for _ in range(4)]
        average = _inline(host).average_ms(CORPUS)
        on_loop = _on_loop(host)
    assert first, "the lexical search finds the handbook"
    assert after == [first] * 4, "the same answer wherever the search ran"
    # No average before the corpus's first search: it runs on a search thread.
    assert threads_seen[0].startswith("search-work")
    assert threads_seen[1:] == [LOOP] * 4
    assert on_loop == 4
    assert average is not None and average <= 50


def test_searches_that_embed_a_query_keep_their_threads(
    host_world: World, threads_seen: list[str]
) -> None:
    settings = host_world.settings(limits={"searchThreads": 1, "inlineSearchMs": 50})
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        _search(host, alice, LEXICAL)  # the corpus has a short average now
        _search(host, alice, LEXICAL)
        for _ in range(3):
            _search(host, alice, HYBRID)  # the world's query cache is off: each embeds
        on_loop = _on_loop(host)
    assert threads_seen[1] == LOOP
    assert all(name.startswith("search-work") for name in threads_seen[2:]), threads_seen
    assert on_loop == 1


@pytest.mark.parametrize(
    "limits",
    [{"searchThreads": 1}, {"inlineSearchMs": 50}],
    ids=["no-budget", "no-search-threads"],
)
def test_without_both_settings_every_search_leaves_the_loop(
    host_world: World, threads_seen: list[str], limits: dict[str, Any]
) -> None:
    settings = host_world.settings(limits=limits)
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        for _ in range(4):
            _search(host, alice, LEXICAL)
        inline = host.app.routes.policy._inline
        on_loop = _on_loop(host)
    assert inline is None
    assert on_loop == 0
    assert not any(name == LOOP for name in threads_seen), threads_seen


def test_one_long_search_on_the_loop_sends_the_next_ones_back_to_threads(
    host_world: World, threads_seen: list[str]
) -> None:
    # The gate holds the `blocked` subject's searches in the authorizer: on the loop, that is
    # how long the loop was held up. Held past the budget, it moves the corpus's average past
    # it at once, and the next searches run on threads until short ones bring it back.
    budget_ms = 20.0
    settings = host_world.settings(limits={"searchThreads": 1, "inlineSearchMs": budget_ms})
    gate = host_world.gate
    token = host_world.tokens["blocked"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        inline = _inline(host)
        gate.release.set()
        _search(host, token, LEXICAL)  # on a thread: the corpus's first
        assert inline.allows(CORPUS)
        gate.release.clear()
        entered = gate.entered
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_search, host, token, LEXICAL)
            wait_until(lambda: gate.entered == entered + 1, what="the search held on the loop")
            # Time passing is what this test is about: hold the loop well past the budget.
            started = time.monotonic()
            wait_until(lambda: time.monotonic() - started > 10 * budget_ms / 1000)
            gate.release.set()
            held.result(timeout=30)
        average = inline.average_ms(CORPUS)
        after = _search(host, token, LEXICAL)
    assert threads_seen[:2] == [threads_seen[0], LOOP]
    assert threads_seen[0].startswith("search-work")
    assert average is not None and average > budget_ms
    assert threads_seen[2].startswith("search-work"), threads_seen
    assert after, "the search on a thread answers as before"


def test_a_search_on_the_loop_fails_as_it_would_on_a_thread(
    host_world: World, threads_seen: list[str]
) -> None:
    # The `boom` subject's authorizer raises: a 500 problem without the message, the same
    # request id header, and the loop keeps serving.
    settings = host_world.settings(limits={"searchThreads": 1, "inlineSearchMs": 50})
    boom = {"Authorization": f"Bearer {host_world.tokens['boom']}"}
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        _search(host, alice, LEXICAL)  # the corpus's average
        with host.client() as client:
            response = client.post("/v1/retrieval/search", json=LEXICAL, headers=boom)
        again = _search(host, alice, LEXICAL)
    assert threads_seen[1] == LOOP
    assert response.status_code == 500
    assert response.json()["code"] == "INTERNAL"
    assert "hunter2" not in response.text
    assert again

"""Searches that call no model run on the event loop (`limits.inlineSearchMs`), over real HTTPS.

The host world's query cache is off, so its hybrid searches always call the model: lexical
searches qualify, and one test serves the world's corpora through a driver with the cache on.
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
from retrieval_host.core.service import RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.http.inline import InlineSearches
from tests.support.host import CORPUS, Gate, RunningHost, World, serve_in_thread, wait_until

LEXICAL = {"corpus": CORPUS, "query": "rotate a token", "mode": "lexical"}
HYBRID = {"corpus": CORPUS, "query": "rotate a token"}
LOOP = "test-host"
ALICE_LEXICAL = (CORPUS, "alice", "lexical", "granted")
# Tests not about the budget give a generous one: searches on a loaded machine take longer.
ROOMY = {"searchThreads": 1, "inlineSearchMs": 1000}


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


def _on_loop(host: RunningHost, outcome: str = "done") -> float:
    value = host.app.metrics.registry.get_sample_value(
        "retrieval_host_searches_on_loop_total", {"corpus": CORPUS, "outcome": outcome}
    )
    return 0.0 if value is None else value


def _search_released(host: RunningHost, token: str, gate: Gate) -> list[str]:
    """A lexical search of the gated subject, the gate open for it only."""
    gate.release.set()
    try:
        return _search(host, token, LEXICAL)
    finally:
        gate.release.clear()


def _search(host: RunningHost, token: str, body: dict[str, Any]) -> list[str]:
    with host.client() as client:
        response = client.post(
            "/v1/retrieval/search", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    assert response.status_code == 200, response.text
    return [hit["chunkId"] for hit in response.json()["hits"]]


def test_a_kinds_first_search_runs_on_a_thread_then_the_loop_takes_short_ones(
    host_world: World, threads_seen: list[str]
) -> None:
    settings = host_world.settings(limits=ROOMY)
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        first = _search(host, alice, LEXICAL)
        after = [_search(host, alice, LEXICAL) for _ in range(4)]
        average = _inline(host).average_ms(ALICE_LEXICAL)
        on_loop = _on_loop(host)
    assert first, "the lexical search finds the handbook"
    assert after == [first] * 4, "the same answer wherever the search ran"
    # No average before the kind's first search: it runs on a search thread.
    assert threads_seen[0].startswith("search-work")
    assert threads_seen[1:] == [LOOP] * 4
    assert on_loop == 4
    assert average is not None and average <= 1000


def test_searches_that_embed_a_query_keep_their_threads(
    host_world: World, threads_seen: list[str]
) -> None:
    settings = host_world.settings(limits=ROOMY)
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        _search(host, alice, LEXICAL)  # the kind has a short average now
        _search(host, alice, LEXICAL)
        for _ in range(3):
            _search(host, alice, HYBRID)  # the world's query cache is off: each embeds
        on_loop = _on_loop(host)
    assert threads_seen[1] == LOOP
    assert all(name.startswith("search-work") for name in threads_seen[2:]), threads_seen
    assert on_loop == 1


def test_without_a_budget_every_search_leaves_the_loop(
    host_world: World, threads_seen: list[str]
) -> None:
    # (A budget without search threads is refused at load: `tests/test_settings.py`.)
    settings = host_world.settings(limits={"searchThreads": 1})
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
    # how long the loop was held up (a wait `core.waits` cannot see: an application's own).
    # Held past five budgets, it moves the kind's average past the budget at once, and the
    # next searches run on threads until short ones bring it back.
    budget_ms = 100.0
    settings = host_world.settings(limits={"searchThreads": 1, "inlineSearchMs": budget_ms})
    gate = host_world.gate
    token = host_world.tokens["blocked"]
    kind = (CORPUS, "blocked", "lexical", "granted")
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        inline = _inline(host)
        _search_released(host, token, gate)  # on a thread: the kind's first
        allowed = inline.allows(kind)
        entered = gate.entered
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_search, host, token, LEXICAL)
            try:
                wait_until(lambda: gate.entered == entered + 1, what="the search held")
                # Time passing is what this test is about: hold the loop well past the budget.
                started = time.monotonic()
                wait_until(lambda: time.monotonic() - started > 10 * budget_ms / 1000)
            finally:
                gate.release.set()  # the loop goes on before anything else is checked
                held.result(timeout=30)
                gate.release.clear()  # as the session's world has it (held searches wait)
        average = inline.average_ms(kind)
        after = _search_released(host, token, gate)
    assert allowed
    assert threads_seen[:2] == [threads_seen[0], LOOP]
    assert threads_seen[0].startswith("search-work")
    assert average is not None and average > budget_ms
    assert threads_seen[2].startswith("search-work"), threads_seen
    assert after, "the search on a thread answers as before"


def test_a_search_on_the_loop_fails_as_it_would_on_a_thread(
    host_world: World, threads_seen: list[str]
) -> None:
    # The `boom` subject's authorizer raises: a 500 problem without the message, and the loop
    # keeps serving.
    settings = host_world.settings(limits=ROOMY)
    boom = {"Authorization": f"Bearer {host_world.tokens['boom']}"}
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        with host.client() as client:  # boom's first search (a thread), then on the loop
            for _ in range(2):
                response = client.post("/v1/retrieval/search", json=LEXICAL, headers=boom)
        again = _search(host, alice, LEXICAL)
    assert threads_seen[:2] == [threads_seen[0], LOOP]
    assert response.status_code == 500
    assert response.json()["code"] == "INTERNAL"
    assert "hunter2" not in response.text
    assert again


def test_a_search_that_would_wait_for_a_writer_moves_to_a_thread_and_the_loop_serves_on(
    host_world: World, threads_seen: list[str]
) -> None:
    # A writer holds the store's connection lock (as through a commit, or SQLite's busy wait
    # for another process's write lock). A search naming its sources reads them under that
    # lock: on the loop it refuses to wait and runs again on a search thread, where it waits,
    # while the loop keeps answering.
    settings = host_world.settings(limits=ROOMY)
    alice = host_world.tokens["alice"]
    named = {**LEXICAL, "sourceIds": ["handbook"]}
    store = host_world.stores[CORPUS]
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        first = _search(host, alice, named)  # the kind's average, from a thread
        with ThreadPoolExecutor(1) as pool:
            with store._db_lock:
                waiting = pool.submit(_search, host, alice, named)
                wait_until(lambda: len(threads_seen) == 3, what="the search moved to a thread")
                with host.client() as client:
                    health = client.get("/healthz").status_code
            second = waiting.result(timeout=30)
        on_loop, moved = _on_loop(host), _on_loop(host, "moved")
    assert threads_seen[1] == LOOP and threads_seen[2].startswith("search-work"), threads_seen
    assert health == 200
    assert second == first
    assert on_loop == 0  # the refused attempt did not end there
    assert moved == 1


def test_a_cached_hybrid_query_runs_on_the_loop_and_answers_the_same(host_world: World) -> None:
    # The world's corpora through a driver whose query cache is on: the first search embeds
    # its query (a thread), the second is the kind's first without a model call (a thread,
    # to measure it), the third runs on the loop.
    driver = Driver(RetrievalService(list(host_world.driver.retrieval.corpora.values())))
    seen: list[str] = []
    search = driver.search_context

    def recorded(request: SearchRequest, context: RequestContext) -> SearchResult:
        seen.append(threading.current_thread().name)
        return search(request, context)

    driver.search_context = recorded  # type: ignore[method-assign]
    settings = host_world.settings(limits=ROOMY)
    alice = host_world.tokens["alice"]
    with serve_in_thread(settings, driver, host_world.tls) as host:
        answers = [_search(host, alice, HYBRID) for _ in range(3)]
        on_loop = _on_loop(host)
    assert all(name.startswith("search-work") for name in seen[:2]), seen
    assert seen[2] == LOOP
    assert answers == [answers[0]] * 3 and answers[0]
    assert on_loop == 1

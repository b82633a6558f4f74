"""Grounded runs end to end over real TLS: a real host (uvicorn, SQLite stores, the local
embedding model) and providers over loopback (the extractive one, and an OpenAI-compatible
account pointed at `FakeOpenAI`, which also serves the `remote` corpus's embeddings, so every
provider and embedding request a run makes is counted there).

Every test that completes a run checks its citations against its manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.evidence import SYSTEM_INSTRUCTIONS
from retrieval_host_client import Problem, ProviderFailedError, validate_source_citations
from retrieval_host_client import run_models as wire
from retrieval_host_client._errors import error_from_problem
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    FakeOpenAI,
    PlannedResponse,
    PlannedToolCall,
)
from tests.support.host import RunningHost, serve_in_thread, wait_until
from tests.support.runs_world import (
    DOCS,
    HEARTBEAT_S,
    PLANTED_TEXT,
    VAULT_TEXT,
    RunsWorld,
    SseItem,
    SseParser,
    build_runs_world,
    raw_tls_socket,
)

QUESTION = "How many charge cycles does the battery last?"
LIBRARY_CHUNKS = {cid for doc in DOCS["library"] for cid, _, _ in doc.chunks}
INBOX_CHUNKS = {cid for doc in DOCS["inbox"] for cid, _, _ in doc.chunks}
# The context each progress phase carries besides `phase` and `type`.
PHASE_CONTEXT: Mapping[str, set[str]] = {
    "retrieval.authorization": {"corpus", "check"},
    "retrieval.embedding": {"corpus", "inputs"},
    "retrieval.scan": {"corpus", "sources"},
    "retrieval.receipt": {"sequence", "status", "sources"},
    "generation": {"step", "provider"},
    "recording": {"sources"},
}


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding, fake: FakeOpenAI
) -> Iterator[RunsWorld]:
    built = build_runs_world(tmp_path_factory.mktemp("runs-world"), local_embedding, fake)
    yield built
    built.close()


@pytest.fixture(scope="module")
def host(world: RunsWorld) -> Iterator[RunningHost]:
    with serve_in_thread(world.settings, world.driver, world.tls, world.environ) as served:
        yield served


@pytest.fixture(autouse=True)
def clean_slate(world: RunsWorld, host: RunningHost) -> Iterator[None]:
    world.fake.reset()
    world.restore_acl()
    yield
    # Whatever a test did, it leaves no slot held and no run unfinished.
    wait_until(lambda: host.app.counters.in_flight == 0, what="slots released")
    wait_until(lambda: "running" not in world.run_statuses(), what="no run left running")


# --- helpers ----------------------------------------------------------------------------------


def run_body(
    *,
    provider: str = "local",
    model: str = "extractive",
    question: str = QUESTION,
    corpus: str | None = "library",
    mode: str = "before",
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"provider": provider, "model": model, "input": question}
    if corpus is not None:
        retrieval: dict[str, Any] = {"corpus": corpus, "mode": mode}
        retrieval.update(extra.pop("retrieval", {}))
        body["retrieval"] = retrieval
    body.update(extra)
    return body


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Streamed:
    """An SSE response read to its end (or until `on_item` said so)."""

    status: int
    headers: httpx.Headers
    items: list[SseItem]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [i.data for i in self.items if not i.is_comment]

    @property
    def pings(self) -> list[SseItem]:
        return [i for i in self.items if i.is_comment]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


def stream_run(
    host: RunningHost,
    token: str,
    body: Mapping[str, Any],
    *,
    on_item: Callable[[SseItem, Sequence[SseItem]], bool] | None = None,
) -> Streamed:
    """POST /v1/runs as SSE and parse every line as it arrives. `on_item(item, so_far)` may
    return True to stop reading (the response is then closed mid-stream)."""
    items: list[SseItem] = []
    parser = SseParser()
    headers = {**auth(token), "Accept": "text/event-stream"}
    with (
        host.client() as client,
        client.stream("POST", "/v1/runs", json=body, headers=headers) as response,
    ):
        if response.status_code != 200:
            response.read()
            return Streamed(response.status_code, response.headers, [])
        for line in response.iter_lines():
            item = parser.line(line, time.monotonic())
            if item is None:
                continue
            if not item.is_comment:
                assert item.name == item.data["type"], "SSE event name and type agree"
            items.append(item)
            if on_item is not None and on_item(item, items):
                break
        return Streamed(response.status_code, response.headers, items)


def post_run(host: RunningHost, token: str, body: Mapping[str, Any]) -> httpx.Response:
    with host.client() as client:
        return client.post("/v1/runs", json=body, headers=auth(token))


def get_run(host: RunningHost, token: str, run_id: str) -> httpx.Response:
    with host.client() as client:
        return client.get(f"/v1/runs/{run_id}", headers=auth(token))


def assert_cited(result: Mapping[str, Any], *, required: bool = True) -> list[str]:
    """SHOW: every completed answer's citations pass `validate_source_citations`."""
    manifest = [s["id"] for s in result["sources"]]
    cited = validate_source_citations(result["text"], manifest, require_citation=required)
    assert set(cited) <= set(manifest)
    return cited


def problem_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == response.status_code
    return body


def without_request_id(problem: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in problem.items() if k != "requestId"}


def chat_texts(fake: FakeOpenAI) -> list[str]:
    """Every message text of every chat request the fake model received, as it received it."""
    texts = []
    for request in fake.chat_requests:
        for message in request.json["messages"]:
            texts.append(str(message.get("content") or ""))
    return texts


# --- 1. event order and shapes ----------------------------------------------------------------


@pytest.mark.parametrize(("provider", "model"), [("local", "extractive"), ("fake", "gpt-test")])
def test_a_streamed_run_sends_started_progress_deltas_then_the_full_result(
    host: RunningHost, world: RunsWorld, provider: str, model: str
) -> None:
    body = run_body(provider=provider, model=model)
    streamed = stream_run(host, world.tokens["alice"], body)
    assert streamed.status == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["cache-control"] == "no-store"
    events = streamed.events
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed"
    assert set(kinds[1:-1]) == {"run.progress", "run.delta"}
    started, completed = events[0], events[-1]
    assert started["runId"].startswith("run_") and started["createdAt"]

    progress = streamed.of_type("run.progress")
    for event in progress:
        wire.RunProgressEvent.model_validate(event)
        assert isinstance(event["phase"], str) and event["phase"]
        assert PHASE_CONTEXT[event["phase"]] <= set(event), event
    phases = [e["phase"] for e in progress]
    first = {phase: phases.index(phase) for phase in PHASE_CONTEXT}
    assert (
        first["retrieval.authorization"]
        < first["retrieval.embedding"]
        < first["retrieval.scan"]
        < first["retrieval.receipt"]
        < first["generation"]
        < first["recording"]
    )
    generation_at = next(n for n, e in enumerate(events) if e.get("phase") == "generation")
    recording_at = next(n for n, e in enumerate(events) if e.get("phase") == "recording")
    delta_at = [n for n, k in enumerate(kinds) if k == "run.delta"]
    assert delta_at and generation_at < min(delta_at) and max(delta_at) < recording_at

    result = completed["result"]
    wire.RunResult.model_validate(result)
    assert result["runId"] == started["runId"] and result["status"] == "completed"
    assert (result["provider"], result["model"]) == (provider, model)
    assert "".join(e["text"] for e in streamed.of_type("run.delta")) == result["text"]
    assert {s["id"] for s in result["sources"]} == LIBRARY_CHUNKS
    for entry in result["sources"]:
        assert entry["origin"] == "retrieval"
        assert entry["source"] == {"id": entry["id"].split("-")[0], "revision": "r1"}
        assert entry["location"]
    thread = next(s for s in result["sources"] if s["id"] == "thread-1")
    assert thread["location"]["documentId"] == "<policy-1@example.org>"
    usage = result["usage"]
    assert usage["generation"]["requests"] == 1
    assert usage["embedding"]["requests"] == 1 and usage["embedding"]["inputTokens"] > 0
    if provider == "fake":
        assert usage["generation"]["inputTokens"] > 0 and usage["generation"]["outputTokens"] > 0
    [receipt] = result["receipts"]
    assert receipt["status"] == "ok" and receipt["query"] == QUESTION
    assert set(receipt["sourceIds"]) == LIBRARY_CHUNKS
    assert result["replayed"] is False and result["corpus"] == "library"
    cited = assert_cited(result)
    assert "battery-1" in cited

    # Without Accept: text/event-stream the same run answers one JSON result.
    response = post_run(host, world.tokens["alice"], body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    plain = response.json()
    wire.RunResult.model_validate(plain)
    assert plain.keys() == result.keys()
    assert plain["runId"] != result["runId"]
    assert plain["text"] == result["text"] and plain["sources"] == result["sources"]
    assert [r["status"] for r in plain["receipts"]] == ["ok"]
    assert_cited(plain)

    record = get_run(host, world.tokens["alice"], result["runId"])
    assert record.status_code == 200
    assert record.json()["status"] == "completed" and record.json()["result"] == result


def test_a_provider_failing_mid_stream_ends_the_stream_with_run_failed_and_a_problem(
    host: RunningHost, world: RunsWorld
) -> None:
    world.fake.set_chat_mode("fail-mid-stream", chunks=3)
    streamed = stream_run(host, world.tokens["alice"], run_body(provider="fake", model="gpt-test"))
    kinds = [e["type"] for e in streamed.events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.failed" and "run.delta" in kinds
    failed = wire.RunFailedEvent.model_validate(streamed.events[-1])
    assert failed.run_id == streamed.events[0]["runId"]
    assert (failed.problem.code, failed.problem.status) == ("PROVIDER_FAILED", 502)
    assert failed.problem.request_id == streamed.headers["x-request-id"]
    record = get_run(host, world.tokens["alice"], streamed.events[0]["runId"]).json()
    assert (record["status"], record["errorCode"], record["result"]) == (
        "failed",
        "PROVIDER_FAILED",
        None,
    )
    # Without SSE, the same failure is one problem response.
    world.fake.set_chat_mode("fail-mid-stream", chunks=3)
    response = post_run(host, world.tokens["alice"], run_body(provider="fake", model="gpt-test"))
    assert response.status_code == 502 and problem_of(response)["code"] == "PROVIDER_FAILED"


def test_a_run_asks_the_model_again_after_a_server_error_when_it_allows_attempts(
    host: RunningHost, world: RunsWorld
) -> None:
    # One HTTP 503 (a real response of the fake's wire format), then normal answers.
    world.fake.set_chat_mode("server-error", times=1)
    before = world.fake.chat_requests_count
    body = run_body(provider="fake", model="gpt-test", maxAttempts=2)
    streamed = stream_run(host, world.tokens["alice"], body)
    assert streamed.events[-1]["type"] == "run.completed", streamed.events[-1]
    retries = [e for e in streamed.of_type("run.progress") if e["phase"] == "generation.retry"]
    assert [(e["attempt"], e["reason"]) for e in retries] == [(2, "http-error")]
    assert world.fake.chat_requests_count == before + 2
    usage = streamed.events[-1]["result"]["usage"]["generation"]
    assert usage["requests"] == 2
    # Without attempts to spare (the default), the same failure ends the run.
    world.fake.set_chat_mode("rate-limited", times=1)
    failed = stream_run(host, world.tokens["alice"], run_body(provider="fake", model="gpt-test"))
    problem = failed.events[-1]["problem"]
    assert (problem["code"], problem["reason"]) == ("PROVIDER_FAILED", "rate-limited")
    # The model's Retry-After (1 s) reaches the caller, who decides when (probe B, session 35).
    assert problem["retryAfter"] == 1
    world.fake.set_chat_mode("rate-limited", times=1)
    answered = post_run(host, world.tokens["alice"], run_body(provider="fake", model="gpt-test"))
    assert answered.status_code == 502 and answered.headers["retry-after"] == "1"
    assert answered.json()["retryAfter"] == 1
    typed = error_from_problem(Problem.model_validate(problem))
    assert isinstance(typed, ProviderFailedError) and typed.retry_after == 1
    too_many = post_run(
        host, world.tokens["alice"], run_body(provider="fake", model="gpt-test", maxAttempts=6)
    )
    assert too_many.status_code == 422


# --- 2. heartbeats and the idle timeout -------------------------------------------------------


def test_heartbeats_arrive_at_the_configured_interval_while_the_provider_stalls(
    host: RunningHost, world: RunsWorld
) -> None:
    world.fake.set_chat_mode("stall", chunks=2)  # the role chunk and one word, then silence
    wanted = 6
    stalled_pings: list[SseItem] = []

    def watch(item: SseItem, items: Sequence[SseItem]) -> bool:
        in_stall = any(not i.is_comment and i.data["type"] == "run.delta" for i in items)
        if item.is_comment and in_stall and len(stalled_pings) < wanted:
            stalled_pings.append(item)
            if len(stalled_pings) == wanted:
                world.fake.release_stalls()
        return False

    streamed = stream_run(
        host, world.tokens["alice"], run_body(provider="fake", model="gpt-test"), on_item=watch
    )
    assert len(stalled_pings) == wanted
    assert all(p.comment is not None and p.comment.startswith("ping") for p in stalled_pings)
    gaps = [b.at - a.at for a, b in itertools.pairwise(stalled_pings)]
    median = statistics.median(gaps)
    assert 0.5 * HEARTBEAT_S <= median <= 1.75 * HEARTBEAT_S, gaps
    # Released, the stream went on to the end.
    completed = streamed.events[-1]
    assert completed["type"] == "run.completed"
    assert_cited(completed["result"])


def test_a_provider_stalled_past_the_idle_timeout_fails_the_run_although_heartbeats_flowed(
    host: RunningHost, world: RunsWorld
) -> None:
    world.fake.set_chat_mode("stall", chunks=2)
    body = run_body(provider="fake", model="gpt-test", idleTimeoutMs=800)
    streamed = stream_run(host, world.tokens["alice"], body)
    events = streamed.events
    assert events[-1]["type"] == "run.failed"
    problem = events[-1]["problem"]
    assert problem["code"] == "TIMEOUT" and problem["status"] == 408
    assert events[-1]["runId"] == events[0]["runId"]
    wire.RunFailedEvent.model_validate(events[-1])
    assert problem["requestId"] == streamed.headers["x-request-id"]
    first_delta = next(i for i in streamed.items if not i.is_comment and i.name == "run.delta")
    failed = streamed.items[-1]
    during = [p for p in streamed.pings if first_delta.at < p.at < failed.at]
    assert len(during) >= 2, "heartbeats flowed during the stall"
    # Heartbeats did not reset the timeout: it fired about 800 ms after the last real progress.
    assert 0.7 <= failed.at - first_delta.at <= 3.0
    wait_until(lambda: world.fake.chat_disconnects == 1, what="provider stream closed")
    record = get_run(host, world.tokens["alice"], events[0]["runId"]).json()
    assert (record["status"], record["errorCode"]) == ("failed", "TIMEOUT")


# --- 3. replay --------------------------------------------------------------------------------


def test_replay_returns_the_recorded_answer_without_new_requests_until_its_source_is_revoked(
    host: RunningHost, world: RunsWorld
) -> None:
    fake, token = world.fake, world.tokens["replayer"]
    body = run_body(provider="fake", model="gpt-test", corpus="remote", idempotencyKey="replay-1")
    body["input"] = "How much energy did the wind farm deliver?"
    first = post_run(host, token, body)
    assert first.status_code == 200
    original = first.json()
    assert original["replayed"] is False
    assert (fake.chat_requests_count, fake.embedding_requests_count) == (1, 1)
    assert original["usage"]["embedding"]["requests"] == 1
    assert_cited(original)
    counted = fake.requests_count

    again = post_run(host, token, body)
    assert again.status_code == 200
    replayed = again.json()
    assert replayed["replayed"] is True
    assert {k: v for k, v in replayed.items() if k != "replayed"} == {
        k: v for k, v in original.items() if k != "replayed"
    }
    assert_cited(replayed)
    streamed = stream_run(host, token, body)
    # The recorded text as one delta: a reader that shows the deltas shows the answer.
    assert [e["type"] for e in streamed.events] == ["run.started", "run.delta", "run.completed"]
    assert streamed.events[1]["text"] == original["text"]
    assert streamed.events[-1]["result"]["replayed"] is True
    assert streamed.events[-1]["result"]["text"] == original["text"]
    assert_cited(streamed.events[-1]["result"])
    # Zero provider and zero embedding requests reached the loopback server.
    assert fake.requests_count == counted

    # The application revokes the evidence's source: the recorded answer is no longer served.
    world.revoke("replayer", original["sources"][0]["source"]["id"])
    refused = post_run(host, token, body)
    assert refused.status_code == 404
    assert problem_of(refused)["code"] == "SOURCE_UNAVAILABLE"
    record = get_run(host, token, original["runId"])
    assert record.status_code == 404 and problem_of(record)["code"] == "SOURCE_UNAVAILABLE"
    assert fake.requests_count == counted


def test_an_interrupted_run_refuses_replay(
    host: RunningHost, world: RunsWorld, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="retrieval_host.access")
    fake, token = world.fake, world.tokens["replayer"]
    fake.set_chat_mode("stall", chunks=2)
    body = run_body(provider="fake", model="gpt-test", corpus="remote", idempotencyKey="cut-1")

    def stop_at_first_delta(item: SseItem, items: Sequence[SseItem]) -> bool:
        return not item.is_comment and item.data["type"] == "run.delta"

    streamed = stream_run(host, token, body, on_item=stop_at_first_delta)
    assert streamed.events[-1]["type"] == "run.delta"  # aborted mid-generation
    run_id = streamed.events[0]["runId"]
    wait_until(lambda: world.run_by_key("replayer", "cut-1") == (run_id, "cancelled", "CANCELLED"))
    wait_until(lambda: fake.chat_disconnects == 1, what="provider stream closed")
    record = get_run(host, token, run_id).json()
    assert (record["status"], record["result"]) == ("cancelled", None)
    # Its access line says so: a stream the client left is not a plain 200 (a black-box test).

    def cut_line() -> dict[str, Any] | None:
        lines = [
            getattr(r, "fields", {})
            for r in caplog.records
            if r.name == "retrieval_host.access" and getattr(r, "fields", {}).get("code")
        ]
        return next((f for f in lines if f.get("route") == "/v1/runs"), None)

    wait_until(lambda: cut_line() is not None, what="the cut stream's access line")
    assert cut_line() == {**(cut_line() or {}), "status": 200, "code": "CANCELLED"}

    chats = fake.chat_requests_count
    refused = post_run(host, token, body)
    assert refused.status_code == 409
    assert problem_of(refused)["code"] == "CONTEXT_REPLAY_UNAVAILABLE"
    assert fake.chat_requests_count == chats


def test_a_key_whose_run_is_still_running_names_that_run_for_the_caller_to_poll(
    host: RunningHost, world: RunsWorld
) -> None:
    """The `in-progress` 409 named its run only inside its English detail (a black-box
    test): `runId` is the run `GET /v1/runs/{id}` reads."""
    fake, token = world.fake, world.tokens["replayer"]
    fake.set_chat_mode("stall", chunks=2)
    body = run_body(provider="fake", model="gpt-test", corpus="remote", idempotencyKey="busy-1")
    refused: list[httpx.Response] = []

    def ask_again_while_it_runs(item: SseItem, items: Sequence[SseItem]) -> bool:
        if not refused and not item.is_comment and item.data["type"] == "run.delta":
            refused.append(post_run(host, token, body))
            fake.release_stalls()
        return False

    streamed = stream_run(host, token, body, on_item=ask_again_while_it_runs)
    assert streamed.events[-1]["type"] == "run.completed"
    [answer] = refused
    assert answer.status_code == 409, answer.text
    problem = problem_of(answer)
    assert (problem["code"], problem["reason"]) == ("CONTEXT_REPLAY_UNAVAILABLE", "in-progress")
    assert problem["runId"] == streamed.events[0]["runId"]


# --- 4. tool mode under a quota ---------------------------------------------------------------


def test_a_model_asking_for_five_searches_under_a_quota_of_two_gets_two(
    host: RunningHost, world: RunsWorld
) -> None:
    fake = world.fake
    queries = [
        "wind farm output",
        "tidal turbines",
        "  Wind FARM   output ",  # the first one again, once normalized
        "solar panels",
        "battery cycles",
    ]
    fake.script_chat(
        [
            PlannedResponse(
                tool_calls=[
                    PlannedToolCall("search_context", json.dumps({"query": q})) for q in queries
                ]
            )
        ]
    )
    body = run_body(
        provider="fake",
        model="gpt-test",
        corpus="remote",
        mode="tool",
        question="What do the renewable pilots report?",
        retrieval={"maxQueries": 2},
    )
    streamed = stream_run(host, world.tokens["alice"], body)
    assert streamed.events[-1]["type"] == "run.completed", streamed.events[-1]
    result = streamed.events[-1]["result"]
    receipts = result["receipts"]
    assert [r["status"] for r in receipts] == [
        "ok",
        "ok",
        "duplicate",
        "quota-exceeded",
        "quota-exceeded",
    ]
    assert [r["sequence"] for r in receipts] == [1, 2, 3, 4, 5]
    assert receipts[2]["key"] == receipts[0]["key"] and receipts[2]["sourceIds"] == []
    assert receipts[2]["query"] == "Wind FARM output"
    # The query as the model sent it, beside the normalized one; successes numbered apart.
    assert receipts[2]["rawQuery"] == "  Wind FARM   output "
    assert [r["success"] for r in receipts] == [1, 2, None, None, None]
    # The raw result beside the request-scoped one: every hit the search returned, in order,
    # with its score; what joined the run's evidence is `sourceIds`, a subset of it.
    for receipt in receipts[:2]:
        raw = receipt["rawHits"]
        assert raw and [h["score"] for h in raw] == sorted((h["score"] for h in raw), reverse=True)
        assert set(receipt["sourceIds"]) <= {h["chunkId"] for h in raw}
        assert receipt["searchMode"] == "hybrid"
    assert all(r["rawHits"] == [] for r in receipts[2:])
    assert [r["outcome"] for r in receipts][2:] == ["duplicate", "quota-exceeded", "quota-exceeded"]
    # The run's retrieval state at its end: the quota used, the keys seen, the sources.
    state = result["state"]
    assert (state["queryCount"], state["maxQueries"]) == (2, 2)
    assert state["seen"] == sorted({r["key"] for r in receipts[:2]})
    assert state["sources"] == sorted({s["source"]["id"] for s in result["sources"]})
    assert fake.embedding_requests_count == 2
    assert result["usage"]["embedding"]["requests"] == 2
    assert result["usage"]["generation"]["requests"] == fake.chat_requests_count == 2
    receipt_events = [
        e for e in streamed.of_type("run.progress") if e["phase"] == "retrieval.receipt"
    ]
    assert [e["status"] for e in receipt_events] == [r["status"] for r in receipts]
    # What the model was told for each call.
    tool_messages = [m for m in fake.chat_requests[1].json["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 5
    assert "BEGIN-EVIDENCE-" in tool_messages[0]["content"]
    assert "already searched" in tool_messages[2]["content"]
    assert all("quota" in m["content"] for m in tool_messages[3:])
    assert_cited(result)


def test_max_context_bytes_bounds_what_all_the_searches_of_a_run_gather(
    host: RunningHost, world: RunsWorld
) -> None:
    fake = world.fake
    texts = {cid: text for doc in DOCS["remote"] for cid, text, _ in doc.chunks}
    queries = ["wind farm output", "tidal turbines", "solar panels"]
    calls = [PlannedToolCall("search_context", json.dumps({"query": q})) for q in queries]

    def gathered(budget: int | None) -> tuple[list[dict[str, Any]], int]:
        fake.script_chat([PlannedResponse(tool_calls=calls)])
        retrieval: dict[str, Any] = {"maxQueries": 3, "limit": 2, "maxContextBytes": budget}
        body = run_body(
            provider="fake",
            model="gpt-test",
            corpus="remote",
            mode="tool",
            question="What do the renewable pilots report?",
            retrieval=retrieval,
        )
        streamed = stream_run(host, world.tokens["alice"], body)
        assert streamed.events[-1]["type"] == "run.completed", streamed.events[-1]
        result = streamed.events[-1]["result"]
        assert_cited(result)
        held = sum(len(texts[s["id"]].encode()) for s in result["sources"])
        return result["receipts"], held

    _, unbounded = gathered(None)
    assert unbounded > max(len(t.encode()) for t in texts.values())  # several passages
    budget = unbounded - 1
    receipts, held = gathered(budget)
    assert 0 < held <= budget  # all three searches together, not each alone
    assert all(r["status"] in ("ok", "quota-exceeded") for r in receipts)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ('It lasts "1,200 charge cycles at 25 degrees" [source:battery-1].', None),
        ('It lasts "2,000 charge cycles" [source:battery-1].', "quote-not-in-passage"),
        ("See [source:vault-1] for more.", "unknown-source"),
        ("The battery lasts long.", "no-citation"),
    ],
)
def test_a_run_asking_for_checked_citations_completes_only_with_valid_ones(
    host: RunningHost, world: RunsWorld, answer: str, reason: str | None
) -> None:
    world.fake.script_chat([PlannedResponse(text=answer)])
    body = run_body(provider="fake", model="gpt-test", citations={"require": True})
    streamed = stream_run(host, world.tokens["alice"], body)
    last = streamed.events[-1]
    if reason is None:
        assert last["type"] == "run.completed", last
        result = last["result"]
        assert result["citations"] == {
            "cited": [
                {
                    "id": "battery-1",
                    "quotes": [{"text": "1,200 charge cycles at 25 degrees", "found": True}],
                }
            ],
            "failure": None,
        }
        assert_cited(result)
        # Recorded with its check: the run's record answers the same.
        record = get_run(host, world.tokens["alice"], result["runId"]).json()
        assert record["result"]["citations"] == result["citations"]
        parsed = wire.RunResult.model_validate(result)
        assert parsed.citations is not None and parsed.citations.cited[0].quotes[0].found
    else:
        assert last["type"] == "run.failed", last
        problem = last["problem"]
        assert (problem["code"], problem["reason"]) == ("INVALID_CITATION", reason)
        assert "2,000" not in problem["detail"]  # the answer's text stays out of problems
        record = get_run(host, world.tokens["alice"], last["runId"]).json()
        assert record["status"] == "failed" and record["errorCode"] == "INVALID_CITATION"


def test_line_separators_in_an_answer_or_a_question_keep_each_event_on_one_line(
    host: RunningHost, world: RunsWorld
) -> None:
    # Probe B (session 37): httpx's `iter_lines` (and `str.splitlines`) also end lines at
    # U+2028, U+2029 and U+0085, which the events' JSON carried raw: a reader as the README
    # shows got `run.delta` and `run.completed` cut in two. `stream_run` reads that way.
    answer = [
        "The battery lasts\u2028",
        "1,200 cycles\u2029",
        "at 25\x85degrees [source:battery-1]",
    ]
    world.fake.script_chat([PlannedResponse(text=answer)])
    question = QUESTION + "\u2028Per cell?"
    streamed = stream_run(
        host, world.tokens["alice"], run_body(provider="fake", model="gpt-test", question=question)
    )
    assert streamed.status == 200
    result = streamed.events[-1]["result"]
    assert result["text"] == "".join(answer)
    assert "".join(e["text"] for e in streamed.of_type("run.delta")) == "".join(answer)
    assert result["receipts"][0]["rawQuery"] == question


def test_a_run_s_min_score_leaves_an_off_topic_question_without_evidence(
    host: RunningHost, world: RunsWorld
) -> None:
    # A black-box test: `retrieval.minScore` was refused (422, extra input), so a run answered
    # every question from whatever ranked first.
    strict = {"searchMode": "dense", "minScore": 0.99}
    plain = post_run(host, world.tokens["alice"], run_body(retrieval=strict))
    assert (plain.status_code, problem_of(plain)["code"]) == (422, "NO_RETRIEVAL_EVIDENCE")
    loose = post_run(host, world.tokens["alice"], run_body(retrieval={"minScore": -1}))
    assert loose.status_code == 200, loose.text
    assert loose.json()["sources"]


def test_a_run_declares_what_no_evidence_does_and_its_result_says_which_it_took(
    host: RunningHost, world: RunsWorld
) -> None:
    nowhere = {"sourceIds": ["nowhere"]}
    reply = "Nothing you may read answers this."
    body = run_body(
        retrieval=nowhere, fallbacks={"noEvidence": {"answer": reply}, "invalidCitation": "fail"}
    )
    streamed = stream_run(host, world.tokens["alice"], body)
    last = streamed.events[-1]
    assert last["type"] == "run.completed", last
    result = last["result"]
    assert result["text"] == reply and result["sources"] == []
    assert result["fallbacks"] == [{"outcome": "no-evidence", "action": "answer"}]
    assert [r["outcome"] for r in result["receipts"]] == ["unavailable"]
    outcomes = [e for e in streamed.of_type("run.progress") if e["phase"] == "outcome"]
    assert outcomes == [
        {"type": "run.progress", "phase": "outcome", "outcome": "no-evidence", "action": "answer"}
    ]
    # Without a declared fallback, the same run fails as it always did.
    failed = stream_run(host, world.tokens["alice"], run_body(retrieval=nowhere)).events[-1]
    assert failed["type"] == "run.failed"
    assert failed["problem"]["code"] == "NO_RETRIEVAL_EVIDENCE"
    assert failed["problem"]["runId"] == failed["runId"]
    # Answered without a stream, the problem names the run too: it is recorded.
    plain = post_run(host, world.tokens["alice"], run_body(retrieval=nowhere))
    problem = problem_of(plain)
    assert (plain.status_code, problem["code"]) == (422, "NO_RETRIEVAL_EVIDENCE")
    assert problem["runId"] not in ("", failed["runId"])
    record = get_run(host, world.tokens["alice"], problem["runId"]).json()
    assert (record["status"], record["errorCode"]) == ("failed", "NO_RETRIEVAL_EVIDENCE")
    bad = post_run(host, world.tokens["alice"], run_body(fallbacks={"noEvidence": "retry"}))
    assert bad.status_code == 422


def test_a_search_that_did_not_answer_is_its_own_outcome_over_https(
    host: RunningHost, world: RunsWorld
) -> None:
    nowhere = {"sourceIds": ["nowhere"]}
    reply = "The documents you named are not available to you."
    body = run_body(
        retrieval=nowhere,
        fallbacks={"noEvidence": {"answer": "Nothing matched."}, "searchFailed": {"answer": reply}},
    )
    streamed = stream_run(host, world.tokens["alice"], body)
    last = streamed.events[-1]
    assert last["type"] == "run.completed", last
    result = last["result"]
    assert result["text"] == reply and result["sources"] == []
    assert result["fallbacks"] == [{"outcome": "search-failed", "action": "answer"}]
    assert [r["outcome"] for r in result["receipts"]] == ["unavailable"]
    outcomes = [e for e in streamed.of_type("run.progress") if e["phase"] == "outcome"]
    assert [e["outcome"] for e in outcomes] == ["search-failed"]
    # Declared `fail`: the search's own code, distinct from "no evidence".
    failing = run_body(retrieval=nowhere, fallbacks={"searchFailed": "fail"})
    failed = stream_run(host, world.tokens["alice"], failing).events[-1]
    assert failed["type"] == "run.failed"
    assert failed["problem"]["code"] in ("SOURCE_UNAVAILABLE", "PERMISSION_DENIED")
    bad = post_run(host, world.tokens["alice"], run_body(fallbacks={"searchFailed": "retry"}))
    assert bad.status_code == 422


# --- 5. revoked between search and generation -------------------------------------------------


def test_a_source_revoked_between_search_and_generation_never_reaches_the_model(
    host: RunningHost, world: RunsWorld
) -> None:
    hook = world.hook
    hook.revoked.clear()
    hook.calls.clear()
    body = run_body(provider="fake", model="gpt-test", question="How did the solar panels age?")
    chats = world.fake.chat_requests_count
    # By default the run fails, as when the revocation comes before recording.
    refused = post_run(host, world.tokens["revokee"], body)
    assert refused.status_code == 404, refused.text
    assert problem_of(refused)["code"] == "SOURCE_UNAVAILABLE"
    assert hook.revoked.is_set()
    assert world.fake.chat_requests_count == chats  # the model was never asked
    # With `sourceUnavailable: "continue"` it goes on without the revoked passage.
    hook.revoked.clear()
    hook.calls.clear()
    response = post_run(
        host, world.tokens["revokee"], {**body, "fallbacks": {"sourceUnavailable": "continue"}}
    )
    assert response.status_code == 200, response.text
    result = response.json()
    # The search found the source (granted while it searched)...
    assert "solar-1" in result["receipts"][0]["sourceIds"]
    search_grants = [granted for asked, granted in hook.calls if asked is None]
    assert search_grants and all("solar" in g for g in search_grants)
    # ...then it was revoked, and nothing of it went to the model.
    assert hook.revoked.is_set()
    assert world.fake.chat_requests_count == chats + 1
    solar_text = DOCS["library"][1].chunks[0][1]
    for text in chat_texts(world.fake):
        assert solar_text not in text and "solar-1" not in text
    assert "solar-1" not in {s["id"] for s in result["sources"]}
    assert {s["id"] for s in result["sources"]} == LIBRARY_CHUNKS - {"solar-1"}
    assert_cited(result)


# --- 7. a planted instruction -----------------------------------------------------------------


def fenced(text: str) -> tuple[str, str]:
    """(delimiter, the fenced body) of the one fence in `text`."""
    match = re.search(r"^BEGIN-(EVIDENCE-[0-9a-f]{32})$", text, re.MULTILINE)
    assert match is not None, "a fence"
    delimiter = match.group(1)
    end = text.rindex(f"\nEND-{delimiter}")
    inside = text[match.end() : end]
    assert delimiter not in inside, "nothing inside closes the fence"
    return delimiter, inside


def test_a_planted_instruction_stays_fenced_and_changes_neither_provider_tools_nor_corpus(
    host: RunningHost, world: RunsWorld
) -> None:
    fake, token = world.fake, world.tokens["alice"]
    question = "When does the lab close on Fridays?"

    # `before`: the evidence is fenced inside the user message.
    body = run_body(provider="fake", model="gpt-test", corpus="inbox", question=question)
    response = post_run(host, token, body)
    assert response.status_code == 200
    before = response.json()
    [request] = fake.chat_requests
    assert request.json["model"] == "gpt-test" and "tools" not in request.json
    assert request.headers["authorization"] == f"Bearer {DEFAULT_API_KEY}"
    system, user = request.json["messages"]
    assert system == {"role": "system", "content": SYSTEM_INSTRUCTIONS}
    delimiter_before, inside = fenced(user["content"])
    assert PLANTED_TEXT in inside and user["content"].count(PLANTED_TEXT) == 1

    # `tool`: a model that obeys the planted text asks for the vault and another account.
    fake.reset()
    obeying = [
        PlannedToolCall("search_context", json.dumps({"query": "lab hours"})),
    ]
    hijack = [
        PlannedToolCall(
            "search_context", json.dumps({"query": "board secrets", "corpus": "vault"})
        ),
        PlannedToolCall("use_provider", json.dumps({"provider": "root-account"})),
    ]
    fake.script_chat([PlannedResponse(tool_calls=obeying), PlannedResponse(tool_calls=hijack)])
    response = post_run(host, token, {**body, "retrieval": {"corpus": "inbox", "mode": "tool"}})
    assert response.status_code == 200
    tool_run = response.json()
    requests = fake.chat_requests
    assert len(requests) == 3
    first_tools = requests[0].json["tools"]
    assert [t["function"]["name"] for t in first_tools] == ["search_context"]
    delimiters = set()
    for sent in requests:
        assert sent.json["model"] == "gpt-test"
        assert sent.json["tools"] == first_tools
        assert sent.headers["authorization"] == f"Bearer {DEFAULT_API_KEY}"
        assert sent.json["messages"][0] == {"role": "system", "content": SYSTEM_INSTRUCTIONS}
        for message in sent.json["messages"]:
            content = str(message.get("content") or "")
            if PLANTED_TEXT in content:
                delimiter, inside = fenced(content)
                assert PLANTED_TEXT in inside
                delimiters.add(delimiter)
    assert len(delimiters) == 1 and delimiters != {delimiter_before}, "one fresh delimiter a run"
    last_tools = [m for m in requests[2].json["messages"] if m["role"] == "tool"]
    assert last_tools[-1]["content"].startswith("Unknown tool")

    for result in (before, tool_run):
        assert result["provider"] == "fake" and result["model"] == "gpt-test"
        assert result["corpus"] == "inbox"
        assert {s["id"] for s in result["sources"]} <= INBOX_CHUNKS
        assert all(set(r["sourceIds"]) <= INBOX_CHUNKS for r in result["receipts"])
        assert_cited(result)
    assert [r["query"] for r in tool_run["receipts"]] == ["lab hours", "board secrets"]
    for text in chat_texts(fake):
        assert VAULT_TEXT not in text and "deal-1" not in text


# --- 9. grants --------------------------------------------------------------------------------


def test_a_run_needs_the_provider_grant_and_for_retrieval_the_corpus_search_grant(
    host: RunningHost, world: RunsWorld
) -> None:
    no_provider = post_run(host, world.tokens["no-provider"], run_body())
    assert no_provider.status_code == 403
    denied = problem_of(no_provider)
    assert denied["code"] == "PERMISSION_DENIED"
    for mode in ("before", "tool"):
        no_search = post_run(host, world.tokens["no-search"], run_body(mode=mode))
        assert no_search.status_code == 403
        assert without_request_id(problem_of(no_search)) == without_request_id(denied)
    # The same token may run without retrieval: the search grant was what it lacked.
    plain = post_run(host, world.tokens["no-search"], run_body(mode="off"))
    assert plain.status_code == 200
    assert plain.json()["sources"] == [] and plain.json()["receipts"] == []
    assert_cited(plain.json(), required=False)
    assert "running" not in world.run_statuses()


def test_a_run_record_is_visible_to_its_own_subject_only(
    host: RunningHost, world: RunsWorld
) -> None:
    response = post_run(host, world.tokens["alice"], run_body())
    assert response.status_code == 200
    result = response.json()
    assert_cited(result)
    mine = get_run(host, world.tokens["alice"], result["runId"])
    assert mine.status_code == 200 and mine.json()["result"]["text"] == result["text"]
    theirs = get_run(host, world.tokens["bob"], result["runId"])
    assert theirs.status_code == 404
    unknown = get_run(host, world.tokens["bob"], "run_" + "0" * 24)
    assert without_request_id(problem_of(theirs)) == without_request_id(problem_of(unknown))
    assert problem_of(theirs)["code"] == "SOURCE_UNAVAILABLE"
    # A parameter the route does not read is refused, not ignored (probe A, session 37).
    with host.client() as client:
        guessed = client.get(
            f"/v1/runs/{result['runId']}",
            params={"include": "evidence"},
            headers=auth(world.tokens["alice"]),
        )
    assert problem_of(guessed)["status"] == 422


def test_reading_or_replaying_a_run_needs_what_running_it_needed(
    host: RunningHost, world: RunsWorld
) -> None:
    # Tokens of alice's subject that lack the provider grant, the search grant on the corpus
    # the evidence came from, or both, see a recorded run exactly as a run that does not exist.
    body = run_body(idempotencyKey="grants-1")
    made = post_run(host, world.tokens["alice"], body)
    assert made.status_code == 200
    run_id = made.json()["runId"]
    assert made.json()["sources"]
    unknown = without_request_id(
        problem_of(get_run(host, world.tokens["alice"], "run_" + "0" * 24))
    )
    for name in ("nothing", "no-provider", "no-search"):
        read = get_run(host, world.tokens[name], run_id)
        assert read.status_code == 404, name
        assert without_request_id(problem_of(read)) == unknown, name
        assert made.json()["text"] not in read.text
    assert get_run(host, world.tokens["alice"], run_id).status_code == 200

    # A replay by idempotency key answers what a first run with those grants would.
    for name in ("nothing", "no-provider", "no-search"):
        replay = post_run(host, world.tokens[name], body)
        fresh = post_run(host, world.tokens[name], run_body(idempotencyKey=f"fresh-{name}"))
        assert replay.status_code == fresh.status_code == 403, name
        assert without_request_id(problem_of(replay)) == without_request_id(problem_of(fresh))

    # A run that failed keeps the grants it needed: no result, but its status is not shown.
    world.fake.set_chat_mode("fail-mid-stream", chunks=3)
    failing = run_body(provider="fake", model="gpt-test", idempotencyKey="grants-failed")
    assert post_run(host, world.tokens["alice"], failing).status_code == 502
    recorded = world.run_by_key("alice", "grants-failed")
    assert recorded is not None
    failed_id = recorded[0]
    assert get_run(host, world.tokens["alice"], failed_id).json()["status"] == "failed"
    for name in ("nothing", "no-provider", "no-search"):
        read = get_run(host, world.tokens[name], failed_id)
        assert without_request_id(problem_of(read)) == unknown, name


# --- 10. a JSON-mode run whose client leaves --------------------------------------------------


def test_a_client_that_disconnects_from_a_json_run_cancels_it(
    host: RunningHost, world: RunsWorld
) -> None:
    fake = world.fake
    fake.set_chat_mode("stall", chunks=2)
    body = json.dumps(
        run_body(provider="fake", model="gpt-test", idempotencyKey="json-leaves")
    ).encode()
    head = (
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens['alice']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with raw_tls_socket(host) as sock:
        sock.sendall(head + body)
        wait_until(lambda: fake.chat_requests_count == 1, what="the provider call")
        assert host.app.counters.in_flight == 1
        assert busy_run_threads(), "the run's worker (and its provider watchdog) are busy"
    # The socket is closed while the provider stalls mid-answer.
    wait_until(lambda: fake.chat_disconnects == 1, what="the provider saw the disconnect")
    wait_until(lambda: (world.run_by_key("alice", "json-leaves") or ("", ""))[1] == "cancelled")
    found = world.run_by_key("alice", "json-leaves")
    assert found is not None and found[2] == "CANCELLED"
    record = get_run(host, world.tokens["alice"], found[0]).json()
    assert (record["status"], record["errorCode"]) == ("cancelled", "CANCELLED")
    wait_until(lambda: host.app.counters.in_flight == 0, what="slot released")
    wait_until(lambda: not busy_run_threads(), what="worker threads idle")


# --- 6. a thousand aborted streams ------------------------------------------------------------

STORM_RUNS = 1000
STORM_CONCURRENCY = 16
# One stream in four uses the `fake` account, stalled after its first word: those runs are
# certainly in progress (mid-generation) when their stream is cut. The others use the
# extractive provider, which usually finishes before the cut reaches the host.
STORM_STALLED_EVERY = 4


@dataclass
class StormTally:
    statuses: dict[int, int]
    aborted: int = 0
    finished: int = 0
    peak_tasks: int = 0
    peak_stalled: int = 0


def _storm_request(i: int, token: str) -> bytes:
    questions = [QUESTION, "How did the solar panels age?", "What is the charging policy?"]
    if i % STORM_STALLED_EVERY == 0:
        body = run_body(provider="fake", model="gpt-test", question=questions[i % 3])
    else:
        body = run_body(question=questions[i % 3], mode="off" if i % 3 == 0 else "before")
    raw = json.dumps(body).encode()
    head = (
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def _storm(host: RunningHost, fake: FakeOpenAI, token: str, seed: int) -> StormTally:
    """Open `STORM_RUNS` SSE runs, `STORM_CONCURRENCY` at a time, and cut each at a random
    point: mid-request, right after sending, after k bytes, after k events, or after a random
    time; half with a TLS close, half with an abrupt abort."""
    rng = random.Random(seed)
    context = host.tls.client_context()
    tally = StormTally({})
    gate = asyncio.Semaphore(STORM_CONCURRENCY)
    loop = asyncio.get_running_loop()

    async def one(i: int) -> None:
        raw = _storm_request(i, token)
        plan = rng.random()
        limit_bytes = rng.randint(1, 6000)
        limit_events = rng.randint(1, 14)
        trigger = rng.choice(["bytes", "events", "time"])
        graceful = rng.random() < 0.5
        async with gate:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", host.port, ssl=context, server_hostname="127.0.0.1"
            )
            # A stalled stream sends nothing but heartbeats after its first word: cut it
            # within a bounded time whatever its trigger, so the storm stays short.
            patience = 0.5 if i % STORM_STALLED_EVERY == 0 else 10.0
            deadline = loop.time() + (rng.uniform(0.0, 0.3) if trigger == "time" else patience)
            try:
                if plan < 0.05:  # gone halfway through the request body
                    writer.write(raw[: len(raw) - 20])
                    await writer.drain()
                    return
                writer.write(raw)
                await writer.drain()
                if plan < 0.10:  # gone before reading anything
                    return
                received = b""
                status: int | None = None
                while True:
                    try:
                        chunk = await asyncio.wait_for(
                            reader.read(4096), max(0.0, deadline - loop.time())
                        )
                    except TimeoutError:
                        return
                    if not chunk:
                        tally.finished += 1
                        return
                    received += chunk
                    if status is None and len(received) >= 12:
                        status = int(received[9:12])
                        tally.statuses[status] = tally.statuses.get(status, 0) + 1
                    if b"event: run.completed" in received or b"event: run.failed" in received:
                        tally.finished += 1
                        return
                    events = received.count(b"\r\n\r\n") - 1  # the head ends with one too
                    if (trigger == "events" and events >= limit_events) or (
                        trigger == "bytes" and len(received) >= limit_bytes
                    ):
                        return
            finally:
                tally.aborted += 1
                if graceful:
                    writer.close()
                    with contextlib.suppress(OSError, TimeoutError):
                        await asyncio.wait_for(writer.wait_closed(), timeout=5)
                else:
                    writer.transport.abort()

    async def sample() -> None:
        # The server's task count while streams are open (read on its own loop).
        while True:
            tally.peak_tasks = max(tally.peak_tasks, await asyncio.to_thread(host.task_count))
            tally.peak_stalled = max(tally.peak_stalled, fake.stalled_streams)
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(one(i) for i in range(STORM_RUNS)))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return tally


def busy_run_threads() -> list[str]:
    """Names of request worker threads (the one executor every route's work runs on, runs
    included) currently executing host code (idle ones wait in the pool).

    Only each thread's innermost frame is read: walking another running thread's `f_back`
    chain (as `traceback.extract_stack` does) can touch a frame that thread is popping, which
    crashed the interpreter under CPU load. An idle pool thread waits inside `_worker` of
    `concurrent.futures.thread`; a provider watchdog exists only while it watches.
    """
    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        if thread.name.startswith("provider-watchdog"):
            busy.append(thread.name)
            continue
        if not thread.name.startswith("request-work_"):
            continue
        frame = frames.get(thread.ident or -1)
        if frame is None:
            continue
        code = frame.f_code
        idle = code.co_name == "_worker" and code.co_filename.endswith(
            os.path.join("concurrent", "futures", "thread.py")
        )
        if not idle:
            busy.append(thread.name)
    return busy


def settled_task_count(host: RunningHost, at_most: int, timeout: float = 15.0) -> int:
    """Poll the server loop's task count until it is at most `at_most`; the last count."""
    counts: list[int] = []

    def settled() -> bool:
        counts.append(host.task_count())
        return counts[-1] <= at_most

    try:
        wait_until(settled, timeout=timeout, what=f"asyncio tasks back to {at_most}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last counts {counts[-5:]}") from None
    return counts[-1]


def test_a_thousand_streams_aborted_at_random_points_leave_nothing_behind(
    host: RunningHost, world: RunsWorld
) -> None:
    # Warm up (sse-starlette starts one shutdown watcher per loop on first use), then measure.
    warm = stream_run(host, world.tokens["alice"], run_body())
    assert_cited(warm.events[-1]["result"])
    wait_until(lambda: host.app.counters.in_flight == 0)
    baseline_tasks = host.task_count()
    before = world.run_statuses()
    threads_before = threading.active_count()

    world.fake.set_chat_mode("stall", chunks=2)
    started = time.monotonic()
    tally = asyncio.run(_storm(host, world.fake, world.tokens["alice"], seed=20240605))
    elapsed = time.monotonic() - started

    assert tally.aborted == STORM_RUNS
    assert set(tally.statuses) <= {200}, tally.statuses  # never refused as busy
    # Every provider stream left stalled by a cut run was hung up by the host: no handler of
    # the fake is still waiting in its stall. (A run cut before the fake reached its stall
    # fails the fake's write instead, so disconnects may be a few short of requests.)
    wait_until(lambda: world.fake.stalled_streams == 0, timeout=15, what="provider streams closed")
    assert tally.peak_stalled > 0  # the measure saw stalled provider streams while they lasted
    # Enough of the storm reached the provider to mean something. How many does depends on the
    # machine: a cut lands at a random point in time or bytes, and under load fewer runs get
    # as far as their provider call before it (78 hang-ups under `under-load`, session 40).
    assert world.fake.chat_disconnects > 20
    assert world.fake.chat_requests_count > 20
    wait_until(lambda: host.app.counters.in_flight == 0, timeout=15, what="slots at baseline")
    assert tally.peak_tasks > baseline_tasks + STORM_CONCURRENCY  # open streams were counted
    assert settled_task_count(host, baseline_tasks) <= baseline_tasks
    wait_until(lambda: not busy_run_threads(), timeout=15, what="worker threads idle")
    wait_until(lambda: "running" not in world.run_statuses(), timeout=15, what="runs settled")
    after = world.run_statuses()
    new = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert new.get("failed", 0) == 0, new
    # Every stalled run was cut mid-generation; many extractive ones ran to their end.
    assert new.get("cancelled", 0) >= world.fake.chat_requests_count, new
    assert new.get("completed", 0) > 300, new
    assert sum(new.values()) <= STORM_RUNS
    # The run pool's threads are bounded by the host's concurrency, not by the streams.
    assert threading.active_count() <= threads_before + world.settings.limits.max_concurrency
    # The host still answers a run after the storm.
    final = stream_run(host, world.tokens["alice"], run_body())
    assert_cited(final.events[-1]["result"])
    print(f"storm: {STORM_RUNS} streams in {elapsed:.1f} s, runs {new}, tally {tally}")

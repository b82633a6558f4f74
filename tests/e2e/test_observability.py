"""Operators' view of a running host: Prometheus metrics and structured JSON logs.

The metrics tests run the app in-process behind real uvicorn over TLS, so the test can hold a
search inside its embedding step (a hook around the real local model, like the authorizer gate
of `tests.support.host`) and read the stores' counters. The log test runs the host as an
operator does, `retrieval-host serve --config FILE`, and reads what the process printed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.ports import EmbeddingBatch
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.service import RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.serving.tokens import new_token, token_config_entry
from retrieval_host.settings import HostSettings
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    FakeOpenAI,
    RecordedRequest,
    Reply,
    openai_error,
)
from tests.support.host import (
    CORPUS,
    RunningHost,
    World,
    build_world,
    raw_connect,
    serve_in_thread,
    wait_until,
)
from tests.support.observability import (
    METRICS_SCRAPER,
    host_process,
    parse_metrics,
    total,
)

HOLD_QUERY = "hold this search inside its embedding step"
RUN_QUESTION = "How do I rotate a token?"
MAX_CONCURRENCY = 4


class HeldEmbedding:
    """The real local model; a search for `HOLD_QUERY` waits after embedding until its
    request has been cancelled (the client went away), so its scan starts already cancelled."""

    def __init__(self, inner: LocalEmbedding) -> None:
        self.inner = inner
        self.entered = threading.Event()

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self.inner.descriptor

    @property
    def max_input_tokens(self) -> int:
        return self.inner.max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        batch = self.inner.embed(texts, cancel)
        if HOLD_QUERY in texts:
            self.entered.set()
            wait_until(lambda: cancel.cancelled, timeout=20, what="the held search's cancel")
        return batch


@dataclasses.dataclass
class MetricsHost:
    host: RunningHost
    world: World
    held: HeldEmbedding
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def metrics_host(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[MetricsHost]:
    directory = tmp_path_factory.mktemp("metrics")
    world = build_world(directory, local_embedding)
    held = HeldEmbedding(local_embedding)
    corpus = dataclasses.replace(world.driver.retrieval.corpus(CORPUS), embedding=held)
    # No query cache: the workload searches the run's question first, and each operation's
    # embedding is to show in the metrics.
    retrieval = RetrievalService([corpus], query_cache_entries=0)
    run_store = SqliteRunStore.open(directory / "runs.db")
    engine = RunEngine(retrieval, {"local": ExtractiveProvider()}, run_store)
    driver = Driver(retrieval, runs=engine)
    tokens = {"runner": new_token(), METRICS_SCRAPER: new_token()}
    runner = token_config_entry(
        tokens["runner"], "alice", search=[CORPUS], index=[CORPUS], providers=["local"]
    )
    scraper = {**token_config_entry(tokens[METRICS_SCRAPER], "prometheus"), "metrics": True}
    settings: HostSettings = world.settings(
        tokens=[*world.token_entries, runner, scraper],
        limits={"maxConcurrency": MAX_CONCURRENCY},
    )
    try:
        with serve_in_thread(settings, driver, world.tls) as host:
            yield MetricsHost(host, world, held, tokens)
    finally:
        run_store.close()
        world.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _scrape(client: httpx.Client, token: str) -> dict[Any, float]:
    response = client.get("/metrics", headers=_bearer(token))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse_metrics(response.text)


def _held_search(metrics: MetricsHost) -> bytes:
    body = json.dumps({"corpus": CORPUS, "query": HOLD_QUERY}).encode()
    head = (
        "POST /v1/retrieval/search HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {metrics.tokens['runner']}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def test_metrics_after_a_workload_show_every_family(metrics_host: MetricsHost) -> None:
    m = metrics_host
    store = m.world.stores[CORPUS]
    runner = _bearer(m.tokens["runner"])
    with m.host.client() as client:
        indexed = client.post(
            "/v1/retrieval/index",
            headers=runner,
            json={
                "corpus": CORPUS,
                "source": {"id": "ops-notes", "revision": "r1"},
                "chunks": [
                    {"id": "ops-1", "text": "Scrape the metrics endpoint every fifteen seconds."},
                    {"id": "ops-2", "text": "Alert when the host is busy for five minutes."},
                ],
            },
        )
        assert indexed.status_code == 200, indexed.text
        searched = client.post(
            "/v1/retrieval/search", headers=runner, json={"corpus": CORPUS, "query": RUN_QUESTION}
        )
        assert searched.status_code == 200, searched.text
        run = {
            "provider": "local",
            "model": "extractive",
            "input": RUN_QUESTION,
            "retrieval": {"corpus": CORPUS, "mode": "before"},
        }

        def run_events(body: Mapping[str, object]) -> list[str]:
            with client.stream(
                "POST", "/v1/runs", headers={**runner, "Accept": "text/event-stream"}, json=body
            ) as stream:
                assert stream.status_code == 200
                return [line for line in stream.iter_lines() if line.startswith("event:")]

        events = run_events(run)
        assert events[-1] == "event: run.completed", events
        # No authorized passage matches these source ids: the run fails before generating.
        no_evidence = {**run, "retrieval": {**run["retrieval"], "sourceIds": ["nowhere"]}}  # type: ignore[dict-item]
        failed = client.post("/v1/runs", headers=runner, json=no_evidence)
        assert failed.json()["code"] == "NO_RETRIEVAL_EVIDENCE", failed.text
        # Streamed, the same failure is a 200 whose last event says it (a black-box test: the
        # metrics and the access log showed a success).
        events = run_events(no_evidence)
        assert events[-1] == "event: run.failed", events
        denied = client.post(
            "/v1/retrieval/search",
            headers=_bearer(m.world.tokens["bob"]),
            json={"corpus": CORPUS, "query": RUN_QUESTION},
        )
        assert denied.status_code == 403

        before = store.counters
        with raw_connect(m.host) as held:
            held.sendall(_held_search(m))
            assert m.held.entered.wait(timeout=20), "the held search never embedded"
            during = _scrape(client, m.tokens[METRICS_SCRAPER])
        # The client went away during the embedding: the scan starts and stops at its first check.
        wait_until(
            lambda: store.counters.scans_cancelled > before.scans_cancelled,
            what="the held search's scan to be cancelled",
        )
        wait_until(lambda: m.host.app.counters.in_flight == 0, what="the held search to end")
        after = _scrape(client, m.tokens[METRICS_SCRAPER])

    # Concurrency: the held search holds a slot; the scrape itself holds none.
    assert total(during, "retrieval_host_concurrency_in_use") == 1
    assert total(after, "retrieval_host_concurrency_in_use") == 0
    assert total(after, "retrieval_host_concurrency_limit") == MAX_CONCURRENCY

    def requests(route: str, status: str) -> float:
        return total(after, "retrieval_host_http_requests_total", route=route, status=status)

    assert requests("/v1/retrieval/index", "200") == 1
    assert requests("/v1/retrieval/search", "200") == 1
    assert requests("/v1/retrieval/search", "403") == 1
    assert requests("/v1/retrieval/search", "499") == 1  # the held one, cancelled
    assert requests("/v1/runs", "200") == 2
    assert requests("/v1/runs", "422") == 1
    streamed = "retrieval_host_streamed_failures_total"
    assert total(after, streamed, route="/v1/runs", code="NO_RETRIEVAL_EVIDENCE") == 1
    assert total(after, streamed) == 1  # the 422 answered as a problem is not counted twice
    assert requests("/metrics", "200") == 1  # the first scrape; each is counted after it renders
    assert requests("/healthz", "200") >= 1  # the readiness poll
    assert not any(
        name == "retrieval_host_http_requests_total" and dict(labels)["route"] not in KNOWN_ROUTES
        for name, labels in after
    )

    def latency(route: str) -> float:
        return total(after, "retrieval_host_http_request_duration_seconds_count", route=route)

    assert latency("/v1/retrieval/search") == 3
    assert latency("/v1/runs") == 3
    assert total(after, "retrieval_host_http_request_duration_seconds_sum", route="/v1/runs") > 0

    # Scans: the search, the run's search, and the held one (cancelled before its first batch).
    scans = total(after, "retrieval_host_search_scan_duration_seconds_count", corpus=CORPUS)
    assert scans == 2
    assert total(after, "retrieval_host_search_scan_duration_seconds_sum", corpus=CORPUS) > 0
    assert total(after, "retrieval_host_store_scans_started_total") == store.counters.scans_started
    assert total(after, "retrieval_host_store_scans_started_total") >= 3
    assert total(after, "retrieval_host_store_scans_cancelled_total") >= 1
    assert total(after, "retrieval_host_store_rows_scored_total") > 0

    for operation in ("index", "search", "run"):
        assert total(after, "retrieval_host_embedding_requests_total", operation=operation) >= 1
        tokens = total(after, "retrieval_host_embedding_input_tokens_total", operation=operation)
        assert tokens > 0, operation

    assert total(after, "retrieval_host_runs_total", outcome="completed") == 1
    assert (
        total(after, "retrieval_host_runs_total", outcome="failed", code="NO_RETRIEVAL_EVIDENCE")
        == 2
    )
    assert total(after, "retrieval_host_limit_rejections_total") == 0


KNOWN_ROUTES = {
    "/v1/retrieval/index",
    "/v1/retrieval/search",
    "/v1/runs",
    "/metrics",
    "/healthz",
    "/readyz",
    "unmatched",
}


def test_metrics_need_a_token_with_the_metrics_grant(metrics_host: MetricsHost) -> None:
    m = metrics_host
    with m.host.client() as client:
        anonymous = client.get("/metrics")
        not_granted = client.get("/metrics", headers=_bearer(m.tokens["runner"]))
        wrong = client.get("/metrics", headers=_bearer("rh_not-a-token"))
        in_query = client.get(f"/metrics?access_token={m.tokens[METRICS_SCRAPER]}")
        posted = client.post("/metrics", headers=_bearer(m.tokens[METRICS_SCRAPER]))
        granted = client.get("/metrics", headers=_bearer(m.tokens[METRICS_SCRAPER]))
        unknown = client.get("/v1/no/such/route/rh_secret")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.json()["code"] == "UNAUTHENTICATED"
    assert not_granted.status_code == 403
    assert not_granted.json()["code"] == "PERMISSION_DENIED"
    assert "metrics grant" in not_granted.json()["detail"]
    assert wrong.status_code == 401
    assert in_query.status_code == 401
    assert posted.status_code == 405
    assert granted.status_code == 200
    assert unknown.status_code == 404
    samples = parse_metrics(granted.text)
    assert total(samples, "retrieval_host_http_requests_total", route="/metrics", status="401") >= 3
    assert total(samples, "retrieval_host_http_requests_total", route="/metrics", status="403") >= 1
    # The raw path of an unknown route is never a label.
    assert "rh_secret" not in granted.text


# --- logs ------------------------------------------------------------------------------------


def _listening_addresses(port: int) -> set[str]:
    """IPv4 and IPv6 addresses with a socket listening on `port` (from /proc/net)."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    found.add(str(ipaddress.IPv4Address(raw[::-1])))
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.add(str(ipaddress.IPv6Address(words)))
    return found


PLANTED = "The zeppelin hangar door code is walnut-quasar-4471."
PLANTED_MARK = "walnut-quasar-4471"
SEARCH_QUERY = "Which door opens the airship hangar of the quokka observatory?"
INGEST_TEXT = "# Marmot rota\n\nThe marmot feeding rota changes every Tuesday at dawn.\n"


def test_logs_are_json_lines_with_request_ids_and_no_secret_or_content(tmp_path: Path) -> None:
    subjects = {"writer": ["local"], "reader": [], METRICS_SCRAPER: []}
    ids: list[tuple[str, int, str]] = []  # (request id, status, route)
    with host_process(
        tmp_path / "host",
        subjects=subjects,
        providers={"local": {"kind": "extractive"}},
        metrics_port=True,
    ) as host:
        with host.client("writer") as writer, host.client("reader") as reader:

            def note(response: httpx.Response, route: str) -> httpx.Response:
                ids.append((response.headers["x-request-id"], response.status_code, route))
                return response

            indexed = note(
                writer.post(
                    "/v1/retrieval/index",
                    json={
                        "corpus": "library",
                        "source": {"id": "hangar", "revision": "r1"},
                        "chunks": [{"id": "hangar-1", "text": PLANTED}],
                    },
                ),
                "/v1/retrieval/index",
            )
            assert indexed.status_code == 200, indexed.text
            searched = note(
                writer.post(
                    "/v1/retrieval/search", json={"corpus": "library", "query": SEARCH_QUERY}
                ),
                "/v1/retrieval/search",
            )
            assert PLANTED in searched.text  # the passage did travel over HTTPS
            ingested = note(
                writer.post(
                    "/v1/retrieval/ingest?corpus=library&sourceId=marmot-rota",
                    content=INGEST_TEXT.encode(),
                    headers={"Content-Type": "text/markdown"},
                ),
                "/v1/retrieval/ingest",
            )
            assert ingested.status_code == 200, ingested.text
            with writer.stream(
                "POST",
                "/v1/retrieval/ingest?corpus=library&sourceId=broken",
                content=b"%PDF-1.4 this is not a PDF",
                headers={"Content-Type": "application/pdf", "Accept": "text/event-stream"},
            ) as stream:
                streamed_body = "".join(stream.iter_text())
                failed_ingest = note(stream, "/v1/retrieval/ingest")
            assert failed_ingest.status_code == 200 and "ingest.failed" in streamed_body
            run = {
                "provider": "local",
                "model": "extractive",
                "input": SEARCH_QUERY,
                "retrieval": {"corpus": "library", "mode": "before"},
            }
            with writer.stream(
                "POST", "/v1/runs", json=run, headers={"Accept": "text/event-stream"}
            ) as stream:
                body = "".join(stream.iter_text())
                note(stream, "/v1/runs")
            assert "run.completed" in body and PLANTED_MARK in body
            denied = note(
                reader.post("/v1/runs", json=run),
                "/v1/runs",
            )
            assert denied.status_code == 403
            in_query = note(
                reader.get(f"/v1/runs/run_x?access_token={host.tokens['writer']}"),
                "/v1/runs/{run_id}",
            )
            assert in_query.status_code == 401
            with host.client(METRICS_SCRAPER) as scraper:
                note(scraper.get("/metrics"), "/metrics")
        # The loopback port serves the same registry without a token, on 127.0.0.1 only.
        assert host.metrics_port is not None
        loopback = httpx.get(f"http://127.0.0.1:{host.metrics_port}/metrics", timeout=10)
        assert loopback.status_code == 200
        assert 'route="/v1/retrieval/index",status="200"' in loopback.text
        # Only there: a readiness probe pointed at this port by mistake is not told "ready".
        for other in ("/readyz", "/healthz", "/", "/metrics/extra"):
            elsewhere = httpx.get(f"http://127.0.0.1:{host.metrics_port}{other}", timeout=10)
            assert elsewhere.status_code == 404, other
        assert _listening_addresses(host.metrics_port) == {"127.0.0.1"}
        code, _ = host.terminate()
        assert code == 0, host.log_text()[-4000:]

    records = host.log_records()  # every line of stderr is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert not any("worker" in r for r in records)  # one process: no worker to name
    access = [r for r in records if r["logger"] == "retrieval_host.access"]
    by_id = {r["requestId"]: r for r in access}
    assert len(by_id) == len(access)  # one line per request
    for request_id, status, route in ids:
        line = by_id[request_id]
        assert (line["status"], line["route"]) == (status, route), line
        assert line["durationMs"] >= 0 and line["method"] in ("GET", "POST")
    assert re.fullmatch(r"[0-9a-f]{32}", ids[0][0])
    assert by_id[ids[0][0]]["subject"] == "writer"
    # An error's code and reason, not its detail (a black-box test: 401/403 lines said nothing).
    assert "code" not in by_id[ids[0][0]]
    refused = {route: by_id[i] for i, status, route in ids if status >= 400}
    assert refused["/v1/runs"]["code"] == "PERMISSION_DENIED"
    assert refused["/v1/runs/{run_id}"]["code"] == "UNAUTHENTICATED"
    assert refused["/v1/runs/{run_id}"]["reason"] == "token-in-query"
    # A stream that ended in its failed event: 200, with the failure's code and reason.
    streamed = by_id[failed_ingest.headers["x-request-id"]]
    assert (streamed["status"], streamed["code"]) == (200, "INVALID_DOCUMENT"), streamed
    assert streamed["reason"] == "pdf-malformed"
    assert all("detail" not in line for line in access)
    assert all("path" not in r and "query" not in r for r in access)
    messages = " ".join(r["message"] for r in records)
    assert "shutting down" in messages and "stores closed" in messages

    text = host.log_text()
    for token in host.tokens.values():
        assert token not in text
    for content in (PLANTED, PLANTED_MARK, SEARCH_QUERY, "quokka", "marmot feeding"):
        assert content not in text, content
    for query_string in ("access_token", "sourceId=", "marmot-rota", "run_x"):
        assert query_string not in text, query_string


def _quoting_error(server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
    """A provider refusing the call with a message that quotes what it was sent, as real APIs
    do ("Invalid content near ...", content filters)."""
    assert isinstance(request.json, dict)
    sent = " ".join(str(m.get("content", "")) for m in request.json["messages"])
    quoted = sent[sent.index(PLANTED_MARK) - 40 :][:200]
    return openai_error(400, f"Invalid content near: {quoted}", type_="invalid_request_error")


def test_a_provider_error_quoting_its_input_reaches_the_caller_but_not_the_log(
    tmp_path: Path,
) -> None:
    with FakeOpenAI() as fake:
        fake.route("POST", "/v1/chat/completions", _quoting_error)
        provider = {"kind": "openai", "baseUrl": fake.base_url, "apiKey": {"env": "FAKE_KEY"}}
        with host_process(
            tmp_path / "host",
            subjects={"writer": ["fake"]},
            providers={"fake": provider},
            environ={"FAKE_KEY": DEFAULT_API_KEY},
        ) as host:
            with host.client("writer") as writer:
                indexed = writer.post(
                    "/v1/retrieval/index",
                    json={
                        "corpus": "library",
                        "source": {"id": "hangar", "revision": "r1"},
                        "chunks": [{"id": "hangar-1", "text": PLANTED}],
                    },
                )
                assert indexed.status_code == 200, indexed.text
                run = {
                    "provider": "fake",
                    "model": "gpt-test",
                    "input": SEARCH_QUERY,
                    "retrieval": {"corpus": "library", "mode": "before"},
                }
                failed = writer.post("/v1/runs", json=run)
            assert failed.status_code == 502, failed.text
            problem = failed.json()
            assert (problem["code"], problem["reason"]) == ("PROVIDER_FAILED", "http-error")
            assert PLANTED_MARK in problem["detail"]  # the caller sees the provider's words
            code, _ = host.terminate()
            assert code == 0, host.log_text()[-4000:]
    messages = [r["message"] for r in host.log_records()]
    assert "PROVIDER_FAILED: http-error" in messages, messages
    text = host.log_text()
    for content in (PLANTED, PLANTED_MARK, SEARCH_QUERY, "Invalid content near"):
        assert content not in text, content

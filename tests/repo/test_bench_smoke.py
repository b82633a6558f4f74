"""The benchmark scripts still run: each one's core function at a tiny size (not a benchmark).

The figures at this size mean nothing; what is checked is that the code paths work and the
answers they time are the right ones (recall, grants, the JSON the bare endpoint renders).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from bench import _machine, filtered, http_search, hybrid, ingest, memory, scan
from bench._bare_app import Message, Receive, Scope, Send, render, static_app
from bench._common import CORPUS, NAMESPACE, Clusters, descriptor, fill, source_id
from bench._http_app import create_driver
from bench._loadgen import Target, fetch_once, request, run_load

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import SearchRequest
from retrieval_host.settings import HostSettings, SettingsError, load_settings
from retrieval_host.wire import retrieval as mapping

SMALL = Clusters(clusters=20)


def test_the_machine_description_names_cpu_cores_and_blas() -> None:
    text = _machine.describe()
    assert "usable cores" in text
    assert "BLAS" in text
    assert _machine.usable_cores() >= 1


def test_scan_finds_the_exact_top_ten_at_a_tiny_size() -> None:
    result = scan.run_scan(
        2_000, per_source=50, rounds=1, queries=2, recall_queries=2, clusters=SMALL
    )
    assert result.recall == 1.0
    assert result.ours_ms > 0 and result.floor_ms > 0
    assert result.bytes == 2_000 * 384 * 4


def test_filtered_searches_only_the_granted_rows_at_a_tiny_size() -> None:
    result = filtered.run_filtered(
        3_000, per_source=100, fractions=(0.1, 1.0), rounds=1, queries=2, clusters=SMALL
    )
    assert [f.rows for f in result.fractions] == [300, 3_000]
    assert all(f.recall == 1.0 for f in result.fractions)


def test_the_filtered_floor_reads_consecutive_sources_as_one_block() -> None:
    assert filtered._ranges([1, 2, 3, 5, 7, 8]) == [(1, 4), (5, 6), (7, 9)]
    assert filtered._ranges([]) == []


def test_memory_measures_fresh_processes_opening_the_store() -> None:
    result = memory.measure_memory(1_000, per_source=100, clusters=SMALL)
    assert result.vector_bytes == 1_000 * 384 * 4
    assert result.text_bytes > 0
    assert result.from_sqlite is not None
    for opened in (result.mapped, result.from_sqlite):
        assert opened.first_answer_s >= opened.open_s > 0
        assert opened.loaded["Rss"] > opened.baseline["Rss"]
    # The mapped index is file pages; the one loaded from SQLite is the process's own memory.
    assert result.mapped.grew("File") >= 1_000 * 384 * 4
    assert result.from_sqlite.grew("Anonymous") > result.mapped.grew("Anonymous")
    assert [len(result.workers[n]) for n in (1, 2)] == [1, 2]
    assert result.worker_total(2) > result.worker_total(1)
    assert any("a second process adds" in line for line in result.lines())


def test_memory_passages_are_split_at_sentence_ends() -> None:
    pieces = list(memory._split("One. " * 400))
    assert all(len(p) <= memory.MAX_PASSAGE_CHARS for p in pieces)
    assert "".join(pieces).replace(" ", "") == ("One." * 400)


def test_ingest_runs_end_to_end_and_embeds_the_same_passages(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    records = [
        {"_id": f"d{i}", "title": f"Finding {i}", "text": f"Cells divide. Result {i} holds."}
        for i in range(3)
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    (result,), low, files, passages = ingest.run(docs=2, rounds=1, threads=1, corpus=corpus)
    assert files == 2
    assert passages >= 2
    assert result.ours > 0 and len(result.direct) == 2 and result.best > 0
    assert low >= ingest.TARGET_COSINE  # the ingest stored the direct model's vectors
    # Where the cores went: the model alone, ours in its process and in the parse workers
    # (at this size a few 10 ms clock ticks: `CpuMeter`'s own test asserts the amounts).
    fastest = max(result.direct, key=lambda shape: result.direct[shape])
    assert result.best_cpu is result.direct_cpu[fastest]
    assert result.direct_cpu.keys() == result.direct.keys()
    assert result.ours_cpu.machine >= result.ours_cpu.others >= 0
    assert 0 <= result.ours_cpu.busy <= 1.01
    assert "CPU per passage" in ingest._cpu_lines([result], passages)


def test_the_cpu_meter_counts_this_process_and_the_machine() -> None:
    meter = _machine.CpuMeter()
    started = time.process_time()
    while time.process_time() - started < 0.2:  # 0.2 s of CPU in this process
        sum(range(10_000))
    use = meter.stop()
    # os.times counts 10 ms clock ticks, up to one behind the clock process_time reads
    # (a run measured 0.18999999999999773).
    assert use.process >= 0.18
    assert use.machine >= 0.1  # every process on the machine, in 10 ms ticks
    assert use.available >= use.machine and 0 < use.busy <= 1.01


def test_ingest_memory_run_reports_peak_and_idle(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    records = [{"_id": f"d{i}", "title": "", "text": f"Cells divide {i}."} for i in range(3)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    memory = ingest.rss_child(3, 1, corpus)
    assert memory["passages"] == 3
    assert memory["peak_mb"] >= memory["idle_mb"] > 0
    assert 0 < memory["data_mb"] < 0.01


@pytest.fixture
def bench_host_settings(tmp_path: Path) -> HostSettings:
    tmp_path.chmod(0o700)
    vectors = SMALL.sample(400, stream=0)
    with SqliteVectorStore.open(tmp_path / "store.sqlite") as store:
        store.open_corpus(descriptor())
        fill(store, vectors, 100)
    np.save(tmp_path / "queries.npy", SMALL.sample(4, stream=4))
    grants = {"tenth": [source_id(1)], "all": [source_id(n) for n in range(4)]}
    (tmp_path / "grants.json").write_text(json.dumps(grants))
    return HostSettings.model_validate(
        {
            "behindProxy": True,
            "store": {"sqlitePath": "store.sqlite"},
            "application": "bench._http_app:create_driver",
            "applicationOptions": {"queries": "queries.npy", "grants": "grants.json"},
            "configDir": str(tmp_path),
        }
    )


def test_the_bench_host_answers_only_inside_the_grant_and_the_bare_json_matches(
    bench_host_settings: HostSettings,
) -> None:
    driver = create_driver(bench_host_settings, {})
    try:
        result = driver.search_context(
            SearchRequest(corpus=CORPUS, query="q2", limit=8, mode="dense"),
            RequestContext(subject="tenth"),
        )
        assert len(result.hits) == 8
        assert {h.source.id for h in result.hits} == {source_id(1)}
        with pytest.raises(RetrievalError):
            driver.search_context(
                SearchRequest(corpus=CORPUS, query="not a bench query"),
                RequestContext(subject="tenth"),
            )
        ours = json.loads(mapping.search_response(result).model_dump_json(by_alias=True))
        corpus = driver.retrieval.corpus(CORPUS)
        candidates = corpus.store.search(
            CORPUS,
            NAMESPACE,
            {source_id(1): "r1"},
            corpus.embedding.embed(["q2"], CancelToken()).vectors[0],
            9,
            CancelToken(),
        )
        bare = json.loads(render(candidates, 8))
        assert [h["chunkId"] for h in bare["hits"]] == [h["chunkId"] for h in ours["hits"]]
        assert set(bare) == set(ours)
        assert set(bare["hits"][0]) == set(ours["hits"][0])
    finally:
        for corpus in driver.retrieval.corpora.values():
            corpus.store.close()


@contextmanager
def _serving(app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> Iterator[int]:
    """`app` served by real uvicorn on a loopback port (yielded) while the block runs."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_the_load_generator_counts_answers_from_a_real_server() -> None:
    with _serving(static_app(b'{"hits":[]}')) as port:
        message = request("POST", "/", b"{}", {"Content-Type": "application/json"})
        target = Target("static", port, [message])
        assert fetch_once(target, message) == (200, b'{"hits":[]}')
        result = run_load(target, clients=2, seconds=0.3, warmup=0.05)
        assert result.ok > 0
        assert result.errors == 0
        assert result.rps > 0


@pytest.mark.parametrize("disjoint", [True, False])
def test_disjoint_clients_never_send_one_request_twice(disjoint: bool) -> None:
    """`bench/text_queries.py`'s unique queries: with overlapping clients (the default, for
    rotating grants) client n's first request is client n-1's second, and a host with a
    query cache answered most "unique" queries from it."""
    received: list[bytes] = []

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        received.append(body)
        await static_app(b"{}")(scope, _empty, send)

    with _serving(recording) as port:
        messages = [request("POST", "/", f"{n}".encode(), {}) for n in range(100_000)]
        target = Target("recording", port, messages, disjoint=disjoint)
        result = run_load(target, clients=4, seconds=0.5, warmup=0.05)
    assert result.ok > 8
    repeated = len(received) - len(set(received))
    assert (repeated == 0) if disjoint else (repeated > 0), (disjoint, len(received), repeated)


async def _empty() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def test_the_http_bench_builds_chroma_requests_with_the_grant_as_a_filter() -> None:
    body = json.loads(http_search.chroma_body(np.ones(3, dtype=np.float32), ["s000001"]))
    assert body["where"] == {"sr": {"$in": ["s000001@r1"]}}
    assert body["n_results"] == http_search.LIMIT
    assert "where" not in json.loads(http_search.chroma_body(np.ones(3, dtype=np.float32), None))


def test_hybrid_times_every_mode_over_the_grant_at_a_tiny_size(
    local_embedding: LocalEmbedding,
) -> None:
    result = hybrid.run_hybrid(
        2_000,
        per_source=50,
        fraction=0.1,
        rounds=1,
        queries=2,
        clusters=SMALL,
        embedding=local_embedding,
    )
    assert result.allowed_sources == 4
    assert set(result.median_ms) == {"dense", "hybrid", "lexical"}
    assert all(ms > 0 for ms in result.median_ms.values())
    # Two queries, limit 10, 200 allowed passages: dense and hybrid fill every answer.
    assert result.hits["dense"] == result.hits["hybrid"] == 20
    assert result.ratio > 0


def test_the_http_bench_starts_its_servers_without_its_own_settings_variables() -> None:
    environ = {
        "RETRIEVAL_HOST_BENCH_CHROMA_VENV": "/opt/chroma-venv",
        "retrieval_host_listen__port": "1",
        "PATH": "/usr/bin",
    }
    env = http_search.server_environment(environ)
    assert not [k for k in env if k.upper().startswith("RETRIEVAL_HOST_")]
    assert env["PATH"] == "/usr/bin" and env["PYTHONPATH"]
    # What the host would have done with the bench's variable: refuse to start.
    with pytest.raises(SettingsError, match="RETRIEVAL_HOST_BENCH_CHROMA_VENV"):
        load_settings(None, environ)

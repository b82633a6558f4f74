"""A stream outlasts a client `timeout` shorter than the host's heartbeat interval.

The host sends a heartbeat comment every `runs.heartbeatS` (15 s by default) and nothing else
while an ingest embeds or a run searches. A client made with `timeout=5` read its streams with
5 s reads, so it gave up on a quiet stretch, and the host, seeing it leave, cancelled the work
(a black-box test: an ingest and a run, each cut after 5 s). A stream's reads now wait at least
the interval plus a margin: 20 s unless `discover()` read the host's own `limits.heartbeatS`.

The host here beats every minute, so no heartbeat arrives during a test, and its embedding is
held for `QUIET_S` whenever it is asked to embed a text holding `HOLD`: the quiet stretch the
client, with a `timeout` of a quarter of it, must sit through.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from anyio.from_thread import start_blocking_portal

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.ports import EmbeddingBatch
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.service import RetrievalService
from retrieval_host.driver import Driver
from retrieval_host_client import (
    AsyncClient,
    Client,
    IngestProgressEvent,
    RetrievalHostTimeoutError,
    RunCompletedEvent,
    RunRequest,
    RunRetrieval,
    RunStartedEvent,
    _options,
)
from retrieval_host_client.models import ProtocolLimits
from tests.client.modes import ClientApi, PortalClient
from tests.support.host import CORPUS, RunningHost, World, build_world, serve_in_thread
from tests.support.ingest_driver import CountingEmbedding

HOLD = "lighthouse-quiet-stretch"
HEARTBEAT_S = 60.0
QUIET_S = 1.0
TIMEOUT_S = 0.25  # the client's: a quarter of the quiet stretch
DOCUMENT = (
    "# Lantern log\n\n"
    + "\n\n".join(f"Entry {i}: the lantern of tower {i} was trimmed at dusk." for i in range(40))
    + f"\n\nEntry 40: {HOLD}, the keeper waited for the fog to lift.\n"
).encode()


class HeldEmbedding(CountingEmbedding):
    """The real local model; a call whose texts hold `HOLD` waits for `release` first."""

    def __init__(self, inner: LocalEmbedding) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        if any(HOLD in text for text in texts):
            self.entered.set()
            if not self.release.wait(timeout=30):
                raise AssertionError("the held embedding was never released")
        return super().embed(texts, cancel)


@dataclasses.dataclass
class QuietHost:
    host: RunningHost
    world: World
    held: HeldEmbedding


@pytest.fixture(scope="module")
def quiet_host(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[QuietHost]:
    directory = tmp_path_factory.mktemp("quiet-host")
    world = build_world(directory, local_embedding)
    held = HeldEmbedding(local_embedding)
    corpus = dataclasses.replace(world.driver.retrieval.corpus(CORPUS), embedding=held)
    # No query cache: a run's question is embedded (and held) every time it is asked.
    retrieval = RetrievalService([corpus], query_cache_entries=0)
    runs = SqliteRunStore.open(directory / "runs.sqlite")
    driver = Driver(
        retrieval, runs=RunEngine(retrieval, {"extractive": ExtractiveProvider()}, runs)
    )
    tokens = [{**entry, "providers": ["extractive"]} for entry in world.token_entries]
    settings = world.settings(tokens=tokens, runs={"heartbeatS": HEARTBEAT_S})
    try:
        with serve_in_thread(settings, driver, world.tls) as host:
            yield QuietHost(host, world, held)
    finally:
        runs.close()
        world.close()


@pytest.fixture
def quiet_client(mode: str, quiet_host: QuietHost) -> Iterator[ClientApi]:
    """The admin's client of the quiet host, in this test's mode, with `timeout=TIMEOUT_S`."""
    options: dict[str, Any] = {
        "token": quiet_host.world.tokens["admin"],
        "ca_bundle": quiet_host.world.tls.ca_file,
        "timeout": TIMEOUT_S,
    }
    with start_blocking_portal("asyncio") as portal:
        api: ClientApi
        if mode == "sync":
            api = Client(quiet_host.host.base_url, **options)
        else:
            api = PortalClient(portal, AsyncClient(quiet_host.host.base_url, **options))
        try:
            yield api
        finally:
            api.close()


@contextmanager
def quiet_stretch(held: HeldEmbedding) -> Iterator[None]:
    """Hold the embedding of `HOLD` for `QUIET_S` from when it starts. A fixed stretch, not a
    wait for some state: its length, longer than the client's timeout, is what is tested."""
    held.entered.clear()
    held.release.clear()
    over = threading.Event()

    def release() -> None:
        # Until the stretch starts, or the test is over without one (a stream cut before it).
        while not held.entered.wait(timeout=0.05):
            if over.is_set():
                break
        else:
            over.wait(timeout=QUIET_S)
        held.release.set()

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    try:
        yield
        assert held.entered.is_set(), "the stream never went quiet"
    finally:
        over.set()  # a test that failed early does not keep the host's work held
        held.release.set()
        releaser.join(timeout=30)


def _run(tag: str) -> RunRequest:
    return RunRequest(
        provider="extractive",
        model="extractive",
        input=f"How is the lantern trimmed? {HOLD} {tag}",
        retrieval=RunRetrieval(corpus=CORPUS, source_ids=["handbook"]),
    )


def test_a_streamed_ingest_outlasts_a_silence_longer_than_the_timeout(
    quiet_client: ClientApi, quiet_host: QuietHost, mode: str
) -> None:
    progress: list[IngestProgressEvent] = []
    started = time.monotonic()
    with quiet_stretch(quiet_host.held):
        result = quiet_client.ingest_context(
            DOCUMENT,
            corpus=CORPUS,
            source_id=f"lantern-log-{mode}",
            media_type="text/markdown",
            on_progress=progress.append,
        )
    assert time.monotonic() - started >= QUIET_S
    assert result.status == "indexed" and result.chunk_count > 0
    assert progress[0].phase == "parse", "the stream had started before it went quiet"
    assert progress[-1].phase == "commit"


def test_a_streamed_run_outlasts_a_silence_longer_than_the_timeout(
    quiet_client: ClientApi, quiet_host: QuietHost, mode: str
) -> None:
    started = time.monotonic()
    with quiet_stretch(quiet_host.held), quiet_client.stream_run(_run(mode)) as stream:
        events = list(stream)
        result = stream.until_done()
    assert time.monotonic() - started >= QUIET_S
    assert isinstance(events[0], RunStartedEvent)
    assert isinstance(events[-1], RunCompletedEvent)
    assert result.status == "completed" and result.sources


def test_reads_wait_for_the_interval_discover_published(
    quiet_client: ClientApi, quiet_host: QuietHost, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An assumed interval far under the host's: without `discover()` the stream is cut...
    monkeypatch.setattr(_options, "DEFAULT_HEARTBEAT_S", 0.2)
    monkeypatch.setattr(_options, "HEARTBEAT_MARGIN_S", 0.1)
    with (
        pytest.raises(RetrievalHostTimeoutError) as cut,
        quiet_stretch(quiet_host.held),
        quiet_client.stream_run(_run(f"{mode}-assumed")) as stream,
    ):
        stream.until_done()
    # A read of the stream timed out (not the connection): in the quiet stretch, or, on a busy
    # machine, in a pause of over 0.3 s before it (the run's search; a wait on the stretch
    # failed this test under load).
    assert cut.value.request_sent
    # ... and once the host has said it beats every minute, the same silence is sat through.
    assert quiet_client.discover().limits.heartbeat_s == HEARTBEAT_S
    with quiet_stretch(quiet_host.held), quiet_client.stream_run(_run(f"{mode}-told")) as stream:
        assert stream.until_done().status == "completed"


def test_a_stream_read_timeout_is_the_interval_plus_a_margin_when_longer() -> None:
    short = httpx.Timeout(5.0, connect=2.0)
    raised = _options.stream_timeout(short, None)
    assert (raised.read, raised.connect, raised.write, raised.pool) == (20.0, 2.0, 5.0, 5.0)
    assert _options.stream_timeout(short, 60.0).read == 65.0  # a host that said it beats slower
    assert _options.stream_timeout(short, 0.5).read == 5.5  # or faster
    longer = httpx.Timeout(30.0)
    assert _options.stream_timeout(longer, None) == longer
    assert _options.stream_timeout(httpx.Timeout(5.0, read=None), None).read is None


def test_an_older_host_without_the_interval_still_parses() -> None:
    limits = {"maxBodyBytes": 1, "maxConcurrency": 1, "headerTimeoutS": 1, "bodyTimeoutS": 1}
    assert ProtocolLimits.model_validate(limits).heartbeat_s is None
    assert ProtocolLimits.model_validate({**limits, "heartbeatS": 2.5}).heartbeat_s == 2.5

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import pytest

from retrieval_host.core import cancel as cancel_module
from retrieval_host.core import validation
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, SearchRequest, SourceInfo
from retrieval_host.core.reasons import TimeoutReason
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, TextDelta
from retrieval_host.core.runs_model import (
    CitationPolicy,
    RunCompleted,
    RunDelta,
    RunFailed,
    RunProgress,
    RunRequest,
    RunResult,
    RunRetrieval,
    RunStarted,
)
from retrieval_host.driver import Driver
from tests.support.run_engine import RunWorld


def _request() -> RunRequest:
    return RunRequest("local", "extractive", "battery lifetime", RunRetrieval("library"))


def test_stream_run_yields_events_in_order_and_get_run_reads_the_record(
    run_world: RunWorld,
) -> None:
    driver = Driver(run_world.service, runs=run_world.engine)
    events = list(driver.stream_run(_request(), RequestContext("alice")))
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunCompleted)
    assert any(isinstance(e, RunDelta) for e in events)
    assert all(e.phase for e in events if isinstance(e, RunProgress))
    record = driver.get_run(events[0].run_id, RequestContext("alice"))
    assert record.status == "completed"
    assert record.result == events[-1].result


def test_leaving_a_stream_early_cancels_the_run(run_world: RunWorld) -> None:
    streaming = threading.Event()

    class Slow:
        kind = "test"

        def generate(
            self, request: GenerationRequest, cancel: CancelToken
        ) -> Iterator[GenerationEvent]:
            yield TextDelta("first ")
            streaming.set()
            while True:  # until the consumer leaves
                cancel.check()
                threading.Event().wait(0.01)
                yield TextDelta("")

    driver = Driver(run_world.service, runs=run_world.with_provider("local", Slow()))
    stream = driver.stream_run(_request(), RequestContext("alice"))
    run_id = ""
    for event in stream:
        if isinstance(event, RunStarted):
            run_id = event.run_id
        if isinstance(event, RunDelta):
            break
    stream.close()  # the generator's finally cancels and joins the worker
    assert streaming.is_set()
    record = run_world.runs.get(run_id)
    assert record is not None
    assert record.status == "cancelled"


def test_a_stream_read_to_its_end_leaves_the_callers_token_alone(run_world: RunWorld) -> None:
    """One token may stop an application's whole job (a run, a search, an ingest): a run
    that completed must not cancel the others sharing it, nor a later call with the same
    context (it did: the stream's end cancelled the caller's token)."""
    driver = Driver(run_world.service, runs=run_world.engine)
    shared = RequestContext("alice", cancel=CancelToken())
    events = list(driver.stream_run(_request(), shared))
    assert isinstance(events[-1], RunCompleted)
    assert not shared.cancel.cancelled
    found = driver.search_context(SearchRequest("library", "battery lifetime"), shared)
    assert found.hits
    assert isinstance(driver.run(_request(), shared), RunResult)
    assert not shared.cancel.cancelled


class _Silent:
    """A provider that stops sending anything (no progress) until released, cancelled or 30 s
    have passed."""

    kind = "test"

    def __init__(self) -> None:
        self.release = threading.Event()

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        deadline = time.monotonic() + 30  # without the timeout the test fails, not hangs
        while not self.release.wait(0.01) and time.monotonic() < deadline:
            cancel.check()
        yield TextDelta("late")


def test_a_runs_idle_timeout_ends_a_silent_run_in_process(run_world: RunWorld) -> None:
    """`RunRequest.idle_timeout_ms` counts real progress in-process as over HTTPS (it was
    validated and then ignored: a silent provider held the run for good)."""
    silent = _Silent()
    driver = Driver(run_world.service, runs=run_world.with_provider("local", silent))
    request = replace(_request(), idle_timeout_ms=200)
    caller = RequestContext("alice", cancel=CancelToken())
    try:
        with pytest.raises(RetrievalError) as timed_out:
            driver.run(request, caller)
        assert timed_out.value.code is ErrorCode.TIMEOUT
        assert timed_out.value.reason == TimeoutReason.IDLE_TIMEOUT
        events = list(driver.stream_run(request, caller))
        assert isinstance(events[-1], RunFailed)
        assert events[-1].error.code is ErrorCode.TIMEOUT
        assert not caller.cancel.cancelled  # only the run timed out
    finally:
        silent.release.set()


def test_text_a_provider_delivers_is_progress_though_it_never_says_so(
    run_world: RunWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Black-box probe A: a plug-in streaming a delta every 0.3 s, never calling
    # `cancel.progress()` itself, was ended as idle by a 1 s timeout. The tokens' clock is
    # the provider's to advance here: 0.15 s per delta, past the 0.2 s timeout in all.
    now = [time.monotonic()]
    monkeypatch.setattr(cancel_module, "time", SimpleNamespace(monotonic=lambda: now[0]))

    class Trickle:
        kind = "test"

        def generate(
            self, request: GenerationRequest, cancel: CancelToken
        ) -> Iterator[GenerationEvent]:
            for word in ("one ", "two ", "three ", "four ", "five"):
                now[0] += 0.15
                yield TextDelta(word)

    driver = Driver(run_world.service, runs=run_world.with_provider("local", Trickle()))
    request = replace(_request(), idle_timeout_ms=200)
    result = driver.run(request, RequestContext("alice"))
    assert result.text == "one two three four five", result.text

    class Stalls(Trickle):
        def generate(
            self, request: GenerationRequest, cancel: CancelToken
        ) -> Iterator[GenerationEvent]:
            yield TextDelta("one ")
            now[0] += 0.25  # a gap longer than the timeout is still idle
            yield TextDelta("two")

    driver = Driver(run_world.service, runs=run_world.with_provider("local", Stalls()))
    with pytest.raises(RetrievalError) as idle:
        driver.run(request, RequestContext("alice"))
    assert idle.value.reason == TimeoutReason.IDLE_TIMEOUT


def test_a_passage_whose_stored_id_no_marker_can_cite_is_left_out_of_a_runs_evidence(
    run_world: RunWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box test: ids an earlier release accepted (`kite tail`, `[frame]`) were chosen
    # as evidence and cited, and every answer citing them failed the citation check.
    with monkeypatch.context() as earlier:  # what the earlier release let through
        earlier.setattr(validation, "check_chunk_id", lambda value: None)
        run_world.service.index_context(
            IndexRequest(
                "library",
                SourceInfo("battery", "r2", title="Battery"),
                [
                    ChunkInput("battery tail", "The measured battery lifetime was 1,200 cycles."),
                    ChunkInput("battery-2", "Battery capacity fell to 80 percent after that."),
                ],
            ),
            RequestContext("alice"),
        )
    run_world.acl.search["battery"] = "r2"
    request = replace(_request(), citations=CitationPolicy(require=True, quotes=True))
    driver = Driver(run_world.service, runs=run_world.engine)
    result = driver.run(request, RequestContext("alice"))
    assert [s.id for s in result.sources if s.source_id == "battery"] == ["battery-2"]
    assert "battery tail" not in result.text and "[source:battery-2]" in result.text
    assert result.citations is not None
    # The passage is still searched and read as before.
    found = driver.search_context(
        SearchRequest("library", "battery lifetime"), RequestContext("alice")
    )
    assert "battery tail" in [h.chunk_id for h in found.hits]

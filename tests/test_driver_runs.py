from __future__ import annotations

import threading
from collections.abc import Iterator

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, TextDelta
from retrieval_host.core.runs_model import (
    RunCompleted,
    RunDelta,
    RunProgress,
    RunRequest,
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

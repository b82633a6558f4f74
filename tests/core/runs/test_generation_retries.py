"""A run's model call asked again after a failure that may pass (`RunRequest.max_attempts`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError, TransientError
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, TextDelta
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs.generation import DELTA_OVERHEAD, MAX_ANSWER_CHARS, MAX_BACKOFF_S
from retrieval_host.core.runs_model import (
    RunCompleted,
    RunDelta,
    RunEvent,
    RunFailed,
    RunProgress,
    RunRequest,
    RunRetrieval,
    RunStarted,
)
from tests.support.run_engine import RunWorld

ALICE = RequestContext("alice")
ANSWER = "The battery lasts ten hours."


def overloaded() -> TransientError:
    return TransientError(ErrorCode.PROVIDER_FAILED, "HTTP 503.", reason="http-error")


class Flaky:
    """Fails its first calls with the given errors (after streaming `streamed` text, if any),
    then answers."""

    kind = "test"

    def __init__(self, *failures: RetrievalError, streamed: str = "") -> None:
        self.failures = list(failures)
        self.streamed = streamed
        self.calls = 0

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        self.calls += 1
        if self.failures:
            failure = self.failures.pop(0)
            if self.streamed:
                yield TextDelta(self.streamed)
            raise failure
        yield TextDelta(ANSWER)


def request(max_attempts: int = 3) -> RunRequest:
    return RunRequest(
        provider="flaky",
        model="m",
        input="How long does the battery last?",
        retrieval=RunRetrieval(corpus="library"),
        max_attempts=max_attempts,
    )


def engine(world: RunWorld, provider: Flaky, backoff_s: float = 0.0) -> RunEngine:
    return RunEngine(world.service, {"flaky": provider}, world.runs, retry_backoff_s=backoff_s)


def test_a_failure_that_may_pass_is_asked_again_and_each_attempt_is_counted(
    run_world: RunWorld,
) -> None:
    flaky = Flaky(overloaded(), overloaded())
    events: list[RunEvent] = []
    engine(run_world, flaky).execute(request(3), ALICE, events.append)
    done = events[-1]
    assert isinstance(done, RunCompleted), done
    assert done.result.text == ANSWER and flaky.calls == 3
    retries = [
        e.context for e in events if isinstance(e, RunProgress) and e.phase.endswith("retry")
    ]
    assert [(r["step"], r["attempt"], r["reason"]) for r in retries] == [
        (1, 2, "http-error"),
        (1, 3, "http-error"),
    ]
    assert done.result.usage.generation.requests == 3  # the failed attempts were requests too
    assert [e.text for e in events if isinstance(e, RunDelta)] == [ANSWER]


def test_without_attempts_left_the_last_failure_ends_the_run(run_world: RunWorld) -> None:
    once = Flaky(overloaded())
    with pytest.raises(TransientError):
        engine(run_world, once).run(request(1), ALICE)  # the default: one attempt, as before
    assert once.calls == 1
    spent = Flaky(overloaded(), overloaded(), overloaded())
    with pytest.raises(RetrievalError) as error:
        engine(run_world, spent).run(request(3), ALICE)
    assert (error.value.code, error.value.reason) == (ErrorCode.PROVIDER_FAILED, "http-error")
    assert spent.calls == 3


def test_a_failure_that_would_come_again_is_not_retried(run_world: RunWorld) -> None:
    bad_key = RetrievalError(ErrorCode.PROVIDER_FAILED, "HTTP 401.", reason="http-error")
    flaky = Flaky(bad_key)
    with pytest.raises(RetrievalError) as error:
        engine(run_world, flaky).run(request(3), ALICE)
    assert error.value is bad_key and flaky.calls == 1


def test_an_attempt_that_streamed_text_is_never_asked_again(run_world: RunWorld) -> None:
    flaky = Flaky(overloaded(), streamed="The batt")
    events: list[RunEvent] = []
    engine(run_world, flaky).execute(request(3), ALICE, events.append)
    assert isinstance(events[-1], RunFailed) and flaky.calls == 1
    assert [e.text for e in events if isinstance(e, RunDelta)] == ["The batt"]


def test_a_cancel_during_the_backoff_ends_the_wait(run_world: RunWorld) -> None:
    cancel = CancelToken()
    context = RequestContext("alice", cancel)
    events: list[RunEvent] = []

    def sink(event: RunEvent) -> None:
        events.append(event)
        if isinstance(event, RunProgress) and event.phase == "generation.retry":
            assert event.context["wait"] == MAX_BACKOFF_S  # 60 s asked, capped
            cancel.cancel()  # the client goes away while the run waits

    flaky = Flaky(overloaded())
    engine(run_world, flaky, backoff_s=60.0).execute(request(2), context, sink)
    failed = events[-1]
    assert isinstance(failed, RunFailed) and failed.error.code is ErrorCode.CANCELLED
    assert flaky.calls == 1


def rate_limited(retry_after_s: float) -> TransientError:
    error = TransientError(ErrorCode.PROVIDER_FAILED, "HTTP 429.", reason="rate-limited")
    error.retry_after_s = retry_after_s
    return error


def test_a_retry_waits_at_least_what_the_service_asked(run_world: RunWorld) -> None:
    flaky = Flaky(rate_limited(0.2))
    events: list[RunEvent] = []
    engine(run_world, flaky, backoff_s=0.01).execute(request(2), ALICE, events.append)
    assert isinstance(events[-1], RunCompleted) and flaky.calls == 2
    [retry] = [e for e in events if isinstance(e, RunProgress) and e.phase == "generation.retry"]
    assert retry.context["wait"] == 0.2


def test_a_service_that_asks_for_longer_than_a_run_waits_is_not_asked_again(
    run_world: RunWorld,
) -> None:
    flaky = Flaky(rate_limited(MAX_BACKOFF_S + 1))
    with pytest.raises(TransientError) as error:
        engine(run_world, flaky).run(request(3), ALICE)
    assert error.value.reason == "rate-limited" and flaky.calls == 1


STREAM_ERROR = RetrievalError(ErrorCode.PROVIDER_FAILED, "stream error.", reason="stream-error")
CANCELLED = RetrievalError(ErrorCode.CANCELLED, "The request was cancelled.")


@pytest.mark.parametrize(
    ("failures", "streamed", "attempts"),
    [
        ((overloaded(), overloaded()), "", 2),  # two attempts, both refused
        ((STREAM_ERROR,), "The", 1),  # cut off after some text
        ((CANCELLED,), "The batt", 1),  # a disconnect mid-stream
    ],
)
def test_a_failed_run_records_what_it_spent_before_it_failed(
    run_world: RunWorld, failures: tuple[RetrievalError, ...], streamed: str, attempts: int
) -> None:
    # A provider bills the attempts it answered (a stream cut off after text too), and the
    # run's search embedded its query: a failed run left no usage record (a black-box
    # tester's note), and one that failed mid-stream none of its generation (review).
    flaky = Flaky(*failures, streamed=streamed)
    metered = RunEngine(run_world.service, {"flaky": flaky}, run_world.runs, usage=run_world.runs)
    events: list[RunEvent] = []
    metered.execute(request(attempts), ALICE, events.append)
    failed = events[-1]
    assert isinstance(failed, RunFailed) and failed.error.code is failures[0].code
    records = run_world.runs.read_usage(subject="alice")
    assert {(r.kind, r.requests, r.run_id) for r in records} == {
        ("generation", len(failures), failed.run_id),
        ("embedding", 1, failed.run_id),
    }


@pytest.mark.parametrize("attempts", [0, 6, True])
def test_max_attempts_outside_1_to_5_is_refused(run_world: RunWorld, attempts: int) -> None:
    flaky = Flaky()
    with pytest.raises(RetrievalError) as error:
        engine(run_world, flaky).run(request(attempts), ALICE)
    assert error.value.code is ErrorCode.INVALID_REQUEST and flaky.calls == 0


class StoreGoesAway(Flaky):
    """Answers, but the run store closes while it does (a database going away mid-run)."""

    def __init__(self, world: RunWorld) -> None:
        super().__init__()
        self.world = world

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        self.world.runs.close()
        yield from super().generate(request, cancel)


def test_a_run_whose_end_cannot_be_recorded_fails_with_the_stores_error(
    run_world: RunWorld,
) -> None:
    # A black-box tester stopped PostgreSQL under runs: recording the run's end failed while
    # its failure was being handled, and the second error escaped as a 500 INTERNAL.
    events: list[RunEvent] = []
    engine(run_world, StoreGoesAway(run_world)).execute(request(1), ALICE, events.append)
    failed = events[-1]
    assert isinstance(failed, RunFailed), failed
    assert (failed.error.code, failed.error.reason) == (ErrorCode.STORE_UNAVAILABLE, "closed")


class Interrupted(Flaky):
    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        yield TextDelta("partial")
        raise KeyboardInterrupt


def test_a_run_interrupted_from_outside_records_its_end_before_the_interrupt_goes_on(
    run_world: RunWorld,
) -> None:
    """Not a RetrievalError nor an Exception: left as it was, the record stayed `running` and
    its lease was renewed for as long as the host lived."""
    events: list[RunEvent] = []
    with pytest.raises(KeyboardInterrupt):
        engine(run_world, Interrupted()).execute(request(), ALICE, events.append)
    started = events[0]
    assert isinstance(started, RunStarted)
    record = run_world.runs.get(started.run_id)
    assert record is not None and (record.status, record.error_code) == ("failed", "INTERNAL")


class Endless:
    """A model that does not stop: 64 KiB deltas for as long as it is read (how many were
    taken is counted)."""

    kind = "test"

    def __init__(self) -> None:
        self.calls = 0
        self.taken = 0

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        self.calls += 1
        while True:
            self.taken += 1
            yield TextDelta("x" * 65536)


def test_an_answer_past_the_hosts_bound_fails_the_run_and_is_not_read_further(
    run_world: RunWorld,
) -> None:
    endless = Endless()
    events: list[RunEvent] = []
    run = RunEngine(run_world.service, {"flaky": endless}, run_world.runs, retry_backoff_s=0)
    run.execute(request(3), ALICE, events.append)
    failed = events[-1]
    assert isinstance(failed, RunFailed), failed
    assert (failed.error.code, failed.error.reason) == (
        ErrorCode.PROVIDER_FAILED,
        "answer-too-large",
    )
    # Not asked again (its text streamed), and read only up to the bound.
    assert endless.calls == 1
    accepted = MAX_ANSWER_CHARS // (65536 + DELTA_OVERHEAD)  # each piece counts its overhead
    assert endless.taken == accepted + 1
    streamed = sum(len(e.text) for e in events if isinstance(e, RunDelta))
    assert streamed == accepted * 65536

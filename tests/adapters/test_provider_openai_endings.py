"""How a chat answer ended (probe G, session 42), from OpenAIChatProvider against a real loopback
server, alone and under the RunEngine with the real SQLite stores: OpenAI's `finish_reason` as
the host's `FinishReason`, a stream that is complete without `[DONE]`, a tool call cut at the
output-token limit, and a call whose server reported no usage."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from retrieval_host.adapters.provider_openai import OpenAIChatProvider
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import (
    FinishReported,
    GenerationEvent,
    GenerationRequest,
    Message,
    TextDelta,
    UsageReported,
)
from retrieval_host.core.runs_model import (
    FallbackApplied,
    Fallbacks,
    FinishReason,
    FixedAnswer,
    GenerationUsage,
    RetrievalMode,
    RunFailed,
    RunRequest,
    RunRetrieval,
)
from tests.support.adapter_factory import ChatFactory
from tests.support.chat_endings import Ending, Endings
from tests.support.fake_openai import FakeOpenAI
from tests.support.host import wait_until
from tests.support.run_engine import RunWorld

MODEL = "gpt-4o-mini"
ALICE = RequestContext("alice")
QUESTION = "How long does the battery last?"
ASKED = GenerationRequest(
    model=MODEL,
    messages=[Message("system", "Answer."), Message("user", f"Question:\n{QUESTION}")],
    provider="openai-main",
    run_id="run_endings",
)


@pytest.fixture
def endings(server: FakeOpenAI) -> Iterator[Endings]:
    with Endings(server) as queued:
        yield queued


def collect(provider: OpenAIChatProvider) -> list[GenerationEvent]:
    return list(provider.generate(ASKED, CancelToken()))


# --- the adapter -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["stream", "json"])
@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "content-filter"),
        ("insufficient_system_resource", "other"),  # a compatible server's own reason
        ("tool_calls", "stop"),
        ("function_call", "stop"),
        (None, "stop"),  # none at all, then `[DONE]`
    ],
)
def test_the_finish_reason_is_reported_after_the_text_and_before_the_usage(
    endings: Endings, make: ChatFactory, finish: str | None, expected: FinishReason, as_json: bool
) -> None:
    endings.queue(Ending(finish=finish, text="The battery lasts", json=as_json))
    events = collect(make())
    assert events == [
        TextDelta("The battery lasts"),
        FinishReported(expected),
        UsageReported(GenerationUsage(input_tokens=10, output_tokens=5)),
    ]


def test_a_stream_complete_but_for_done_ends_at_its_usage_chunk_not_at_timeout(
    server: FakeOpenAI, endings: Endings, make: ChatFactory
) -> None:
    # Probe G: text, finish_reason and usage arrived, then the server neither sent `[DONE]`
    # nor ended the body, and the run failed `timeout` after `timeoutS` with its whole answer.
    endings.queue(Ending(text="The battery lasts.", done=False, stall=True))
    provider = make(timeout_s=60.0)
    events: list[GenerationEvent] = []
    errors: list[BaseException] = []
    finished = threading.Event()

    def read() -> None:
        try:
            events.extend(collect(provider))
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            finished.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # Far below `timeout_s`: it ends as soon as the usage chunk is read.
        assert finished.wait(20), "the call still waits for [DONE]"
        assert errors == []
        assert events[-2:] == [
            FinishReported("stop"),
            UsageReported(GenerationUsage(input_tokens=10, output_tokens=5)),
        ]
        # The fake held the stream open, [DONE] unsent, until the provider hung up.
        wait_until(lambda: server.chat_disconnects == 1, what="the provider's hang-up")
    finally:
        server.release_stalls()
        reader.join()


def test_without_a_usage_chunk_a_finished_stream_still_waits_for_its_end(
    endings: Endings, make: ChatFactory
) -> None:
    # A finish_reason alone is not the end: the usage chunk (or `[DONE]`) may follow.
    endings.queue(Ending(text="The battery lasts.", usage=False, done=False, stall=True))
    with pytest.raises(RetrievalError) as info:
        collect(make(timeout_s=0.5))
    assert (info.value.code, info.value.reason) == (ErrorCode.PROVIDER_FAILED, "timeout")


@pytest.mark.parametrize("as_json", [False, True], ids=["stream", "json"])
def test_a_call_without_usage_logs_one_warning_naming_the_provider(
    endings: Endings, make: ChatFactory, caplog: pytest.LogCaptureFixture, as_json: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="retrieval_host.usage")
    endings.queue(Ending(usage=False, json=as_json), Ending(json=as_json))
    provider = make(account_id="team-a")
    assert not any(isinstance(e, UsageReported) for e in collect(provider))
    assert any(isinstance(e, UsageReported) for e in collect(provider))  # logs nothing
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "'openai-main' reported no token usage" in record.getMessage()
    assert record.__dict__["fields"] == {
        "provider": "openai-main",
        "kind": "openai",
        "account": "team-a",
        "model": MODEL,
        "runId": "run_endings",
        "step": 1,
    }


# --- under the run engine ----------------------------------------------------------------------


def _run(mode: RetrievalMode = "before", **extra: Any) -> RunRequest:
    return RunRequest(
        provider="openai",
        model=MODEL,
        input=QUESTION,
        retrieval=RunRetrieval(corpus="library", mode=mode),
        **extra,
    )


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("stop", "stop"), ("length", "length"), ("content_filter", "content-filter"), ("x", "other")],
)
def test_a_completed_run_records_how_its_answer_ended(
    run_world: RunWorld, endings: Endings, make: ChatFactory, finish: str, expected: str
) -> None:
    endings.queue(Ending(finish=finish))  # the fake's cited answer, ended so
    result = run_world.with_provider("openai", make()).run(_run(), ALICE)
    assert result.finish_reason == expected
    record = run_world.runs.get(result.run_id)
    assert record is not None and record.result is not None
    assert record.result.finish_reason == expected


def test_a_tool_mode_run_reports_its_final_answers_ending(
    run_world: RunWorld, endings: Endings, make: ChatFactory, server: FakeOpenAI
) -> None:
    # The first call asks to search (`tool_calls`), the second answers and is cut.
    endings.queue(Ending(finish="tool_calls"), Ending(finish="length"))
    result = run_world.with_provider("openai", make()).run(_run("tool"), ALICE)
    assert server.chat_requests_count == 2
    assert [r.outcome for r in result.receipts] == ["evidence"]
    assert result.finish_reason == "length"


def test_a_fixed_fallback_reply_is_a_whole_answer(
    run_world: RunWorld, endings: Endings, make: ChatFactory
) -> None:
    endings.queue(Ending(finish="length", text="The battery lasts [source:nowhere"))
    fixed = Fallbacks(invalid_citation=FixedAnswer("Ask the battery team."))
    result = run_world.with_provider("openai", make()).run(_run(fallbacks=fixed), ALICE)
    assert result.text == "Ask the battery team."
    assert result.fallbacks == (FallbackApplied("invalid-citation", "answer"),)
    assert result.finish_reason == "stop"


def test_the_extractive_provider_ends_its_answers_stop(run_world: RunWorld) -> None:
    local = RunRequest(
        provider="local",
        model="extractive",
        input=QUESTION,
        retrieval=RunRetrieval(corpus="library", mode="before"),
    )
    assert run_world.engine.run(local, ALICE).finish_reason == "stop"


def test_a_tool_call_cut_at_the_output_limit_fails_the_run_answer_truncated(
    run_world: RunWorld, endings: Endings, make: ChatFactory, server: FakeOpenAI
) -> None:
    # Probe G: the cut arguments were searched, the search failed, and the run ended
    # `NO_RETRIEVAL_EVIDENCE` as if the corpus had nothing.
    endings.queue(Ending(finish="length", tool_arguments='{"query": "batt'))
    events: list[Any] = []
    engine = run_world.with_provider("openai", make())
    engine.execute(_run("tool"), ALICE, events.append)
    failed = events[-1]
    assert isinstance(failed, RunFailed)
    assert (failed.error.code, failed.error.reason) == (
        ErrorCode.PROVIDER_FAILED,
        "answer-truncated",
    )
    assert server.chat_requests_count == 1  # no step after the cut call
    record = run_world.runs.get(failed.run_id)
    assert record is not None
    assert (record.status, record.error_code) == ("failed", "PROVIDER_FAILED")


def test_a_run_whose_provider_reported_no_usage_completes_and_warns_with_its_run(
    run_world: RunWorld, endings: Endings, make: ChatFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="retrieval_host.usage")
    endings.queue(Ending(usage=False))
    result = run_world.with_provider("openai", make()).run(_run(), ALICE)
    assert result.usage.generation == GenerationUsage(requests=1)
    [record] = caplog.records
    assert record.__dict__["fields"]["provider"] == "openai"
    assert record.__dict__["fields"]["runId"] == result.run_id

"""How a run's answer ended (probe G, session 42), through the client in both modes against the
real host over TLS, its `chat` provider streaming from the loopback fake: `finishReason` in every
form of the result, a record written before runs kept it, a tool call cut at the output-token
limit, a stream complete without `[DONE]`, and a provider that reported no usage."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from retrieval_host_client import ProviderFailedError, RunRequest, RunRetrieval
from tests.client.conftest import CHAT_MODEL, Connect
from tests.client.modes import ClientApi
from tests.support.chat_endings import Ending, Endings
from tests.support.fake_openai import FakeOpenAI
from tests.support.host import CORPUS, RunningHost, World, wait_until
from tests.support.run_records import forget_finish_reason

QUESTION = "How do I rotate a token?"


def _request(
    provider: str = "chat", mode: Literal["before", "tool"] = "before", key: str | None = None
) -> RunRequest:
    return RunRequest(
        provider=provider,
        model=CHAT_MODEL if provider == "chat" else "extractive",
        input=QUESTION,
        retrieval=RunRetrieval(corpus=CORPUS, mode=mode, source_ids=["handbook"]),
        idempotency_key=key,
    )


@pytest.fixture
def endings(fake_openai: FakeOpenAI) -> Iterator[Endings]:
    fake_openai.set_chat_mode("ok")  # stalls hold (a released one stays released until then)
    with Endings(fake_openai) as queued:
        try:
            yield queued
        finally:
            if fake_openai.stalled_streams:  # one a failed test left: let the run end
                fake_openai.release_stalls()
                wait_until(lambda: fake_openai.stalled_streams == 0, what="stalls released")
            fake_openai.set_chat_mode("ok")


def _raw_result(host: RunningHost, world: World, run_id: str) -> dict[str, Any]:
    """The `result` of `GET /v1/runs/{id}` as the host wrote it."""
    with host.client() as http:
        answer = http.get(
            f"/v1/runs/{run_id}", headers={"Authorization": f"Bearer {world.tokens['admin']}"}
        )
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()["result"]
    return result


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("stop", "stop"), ("length", "length"), ("content_filter", "content-filter"), ("x", "other")],
)
def test_the_result_says_how_the_answer_ended_in_every_form(
    api: ClientApi,
    endings: Endings,
    client_host: RunningHost,
    client_world: World,
    finish: str,
    expected: str,
) -> None:
    key = f"endings-{uuid.uuid4().hex}"
    endings.queue(Ending(finish=finish), Ending(finish=finish))
    answered = api.run(_request(key=key))  # the JSON answer
    with api.stream_run(_request()) as stream:
        streamed = stream.until_done()  # `run.completed`'s result
    replayed = api.run(_request(key=key))
    recorded = api.get_run(answered.run_id).result
    assert len(endings.served) == 2  # the replay called no model
    assert replayed.replayed and recorded is not None
    assert [r.finish_reason for r in (answered, streamed, replayed, recorded)] == [expected] * 4
    # The wire name, as the host writes it.
    assert _raw_result(client_host, client_world, streamed.run_id)["finishReason"] == expected


def test_an_extractive_answer_ends_stop(api: ClientApi) -> None:
    assert api.run(_request("extractive")).finish_reason == "stop"


def test_a_record_written_before_runs_kept_the_ending_reads_as_unknown(
    api: ClientApi, client_host: RunningHost, client_world: World
) -> None:
    result = api.run(_request("extractive"))
    forget_finish_reason(client_world.directory / "store" / "runs.sqlite", result.run_id)
    raw = _raw_result(client_host, client_world, result.run_id)
    assert "finishReason" in raw and raw["finishReason"] is None
    record = api.get_run(result.run_id)
    assert record.result is not None and record.result.finish_reason is None


def test_a_tool_call_cut_at_the_output_limit_fails_answer_truncated(
    api: ClientApi, endings: Endings
) -> None:
    cut = Ending(finish="length", tool_arguments='{"query": "rot')
    endings.queue(cut, cut)
    with pytest.raises(ProviderFailedError) as direct:
        api.run(_request(mode="tool"))
    with (
        api.stream_run(_request(mode="tool")) as stream,
        pytest.raises(ProviderFailedError) as streamed,
    ):
        stream.until_done()
    for error in (direct.value, streamed.value):
        assert (error.code, error.reason) == ("PROVIDER_FAILED", "answer-truncated")
        assert error.run_id is not None
        assert api.get_run(error.run_id).error_code == "PROVIDER_FAILED"
    assert len(endings.served) == 2  # one model call each: nothing was searched with the cut


def test_an_answer_complete_but_for_done_completes_long_before_the_providers_timeout(
    connect: Connect, endings: Endings, fake_openai: FakeOpenAI
) -> None:
    # Probe G: text, finish_reason and usage arrived, then the server neither sent `[DONE]`
    # nor ended the body; the run failed `timeout` after `timeoutS` (here 120 s) instead.
    hangups = fake_openai.chat_disconnects
    endings.queue(Ending(done=False, stall=True))
    api = connect(timeout=20)  # fails this test without waiting for the provider's 120 s
    result = api.run(_request())
    assert "[source:handbook-" in result.text
    assert result.finish_reason == "stop"
    # The fake still held the stream, [DONE] unsent, when the host hung up on it.
    wait_until(lambda: fake_openai.chat_disconnects == hangups + 1, what="the host's hang-up")


def test_a_provider_that_reports_no_usage_completes_and_the_host_warns(
    api: ClientApi, endings: Endings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="retrieval_host.usage")
    endings.queue(Ending(usage=False))
    result = api.run(_request())
    usage = result.usage.generation
    assert (usage.requests, usage.input_tokens, usage.output_tokens) == (1, 0, 0)
    [record] = [r for r in caplog.records if "reported no token usage" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.__dict__["fields"]["provider"] == "chat"
    assert record.__dict__["fields"]["runId"] == result.run_id

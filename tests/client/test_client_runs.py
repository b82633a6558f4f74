"""Grounded runs through the client, against the real host over TLS, in both modes; and the
asyncio task cancellation that must cancel the run on the host."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from retrieval_host_client import (
    AsyncClient,
    Client,
    NoRetrievalEvidenceError,
    PermissionDeniedError,
    RunCompletedEvent,
    RunDeltaEvent,
    RunFailedEvent,
    RunProgressEvent,
    RunRequest,
    RunRetrieval,
    RunStartedEvent,
    SourceUnavailableError,
    validate_source_citations,
)
from retrieval_host_client.run_models import FallbackAnswer, Fallbacks
from tests.client.conftest import CHAT_MODEL, Connect
from tests.client.modes import ClientApi
from tests.support.fake_openai import FakeOpenAI
from tests.support.host import CORPUS, RunningHost, World, wait_until

QUESTION = "How do I rotate a token?"
GROUNDED = RunRequest(
    provider="extractive",
    model="extractive",
    input=QUESTION,
    retrieval=RunRetrieval(corpus=CORPUS, source_ids=["handbook"]),
)


def test_run_returns_a_cited_result_recorded_by_the_host(api: ClientApi) -> None:
    result = api.run(GROUNDED)
    assert result.status == "completed"
    assert result.provider == "extractive"
    ids = [source.id for source in result.sources]
    assert ids and all(i.startswith("handbook-") for i in ids)
    assert all(s.origin == "retrieval" and s.source.id == "handbook" for s in result.sources)
    cited = validate_source_citations(result.text, ids, require_citation=True)
    assert set(cited) <= set(ids)
    assert result.receipts[0].status == "ok"
    assert result.usage.embedding.requests >= 1

    record = api.get_run(result.run_id)
    assert record.status == "completed"
    assert record.result is not None
    assert record.result.text == result.text


def test_stream_run_yields_typed_events_then_the_result(api: ClientApi) -> None:
    with api.stream_run(GROUNDED.model_dump()) as stream:
        events = list(stream)
        result = stream.until_done()
    assert isinstance(events[0], RunStartedEvent)
    assert isinstance(events[-1], RunCompletedEvent)
    phases = [e.phase for e in events if isinstance(e, RunProgressEvent)]
    assert "generation" in phases
    assert any(p.startswith("retrieval.") for p in phases)
    text = "".join(e.text for e in events if isinstance(e, RunDeltaEvent))
    assert text == result.text
    assert stream.run_id == events[0].run_id == result.run_id
    assert stream.result == result
    validate_source_citations(result.text, [s.id for s in result.sources], require_citation=True)


def test_a_run_without_evidence_fails_typed_in_both_forms(api: ClientApi) -> None:
    # A one-byte context budget excludes every (whole) passage: no evidence, no generation.
    starved = GROUNDED.model_copy(
        update={"retrieval": RunRetrieval(corpus=CORPUS, max_context_bytes=1)}
    )
    with pytest.raises(NoRetrievalEvidenceError) as direct:
        api.run(starved)
    assert direct.value.code == "NO_RETRIEVAL_EVIDENCE"
    with api.stream_run(starved) as stream:
        events = list(stream)
        assert isinstance(events[-1], RunFailedEvent)
        with pytest.raises(NoRetrievalEvidenceError) as streamed:
            stream.until_done()
    assert streamed.value.status == 422
    assert stream.run_id is not None
    # Either way the error names the failed run, recorded by the host.
    assert streamed.value.run_id == stream.run_id
    assert direct.value.run_id is not None and direct.value.run_id != stream.run_id
    for run_id in (direct.value.run_id, stream.run_id):
        record = api.get_run(run_id)
        assert (record.status, record.error_code) == ("failed", "NO_RETRIEVAL_EVIDENCE")


def test_a_refused_stream_raises_before_any_event(connect: Connect) -> None:
    with pytest.raises(PermissionDeniedError), connect("bob").stream_run(GROUNDED):
        raise AssertionError("the block is never entered")  # pragma: no cover


def test_another_subjects_run_is_unavailable(connect: Connect) -> None:
    result = connect("admin").run(GROUNDED)
    with pytest.raises(SourceUnavailableError):
        connect("alice").get_run(result.run_id)
    with pytest.raises(SourceUnavailableError):
        connect("admin").get_run("run_does_not_exist")
    # An id holding `/` is a missing run too, not a missing route (a black-box test).
    with pytest.raises(SourceUnavailableError):
        connect("admin").get_run("../../v1/protocol")


def test_leaving_a_sync_loop_early_keeps_the_stream_for_until_done(
    client_host: RunningHost, client_world: World
) -> None:
    # A black-box test: `break`, then `until_done()` raised httpx's StreamConsumed and the
    # host had cancelled the run (the async client went on, as the README's pattern expects).
    token = client_world.tokens["admin"]
    with (
        Client(client_host.base_url, token=token, ca_bundle=client_world.tls.ca_file) as client,
        client.stream_run(GROUNDED) as stream,
    ):
        seen = []
        for event in stream:
            seen.append(event)
            break
        assert isinstance(seen[0], RunStartedEvent)
        following = next(iter(stream))  # iterating again goes on from the next event
        assert not isinstance(following, RunStartedEvent)
        result = stream.until_done()
        assert list(stream) == []  # nothing after the end
    assert "[source:" in result.text and result.run_id == stream.run_id
    with Client(client_host.base_url, token=token, ca_bundle=client_world.tls.ca_file) as again:
        assert again.get_run(result.run_id).status == "completed"


def _stalling_request() -> RunRequest:
    return RunRequest(
        provider="chat",
        model=CHAT_MODEL,
        input=QUESTION,
        retrieval=RunRetrieval(corpus=CORPUS, source_ids=["handbook"]),
    )


def _poll(predicate: Callable[[], bool], what: str) -> None:
    wait_until(predicate, timeout=10, what=what)


def test_leaving_the_stream_block_cancels_the_run_on_the_host(
    api: ClientApi, fake_openai: FakeOpenAI
) -> None:
    fake_openai.set_chat_mode("stall", chunks=2)
    calls, hangups = fake_openai.chat_requests_count, fake_openai.chat_disconnects
    try:
        with api.stream_run(_stalling_request()) as stream:
            for event in stream:
                if isinstance(event, RunDeltaEvent):
                    break  # the provider is now stalled mid-answer
        run_id = stream.run_id
        assert run_id is not None
        _poll(lambda: api.get_run(run_id).status == "cancelled", "the run to be cancelled")
        _poll(lambda: fake_openai.chat_disconnects == hangups + 1, "the provider hang-up")
        assert fake_openai.chat_requests_count == calls + 1
    finally:
        fake_openai.set_chat_mode("ok")


@pytest.fixture
async def async_client(client_host: RunningHost, client_world: World) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(
        client_host.base_url, token=client_world.tokens["admin"], ca_bundle=client_world.tls.ca_file
    ) as client:
        yield client


async def _apoll(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 10
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.mark.anyio
async def test_cancelling_the_asyncio_task_cancels_the_run_and_stops_the_provider(
    async_client: AsyncClient, fake_openai: FakeOpenAI
) -> None:
    fake_openai.set_chat_mode("stall", chunks=2)
    calls, hangups = fake_openai.chat_requests_count, fake_openai.chat_disconnects
    streaming = asyncio.Event()
    run_ids: list[str] = []

    async def consume() -> None:
        async with async_client.stream_run(_stalling_request()) as stream:
            async for event in stream:
                if isinstance(event, RunStartedEvent):
                    run_ids.append(event.run_id)
                if isinstance(event, RunDeltaEvent):
                    streaming.set()  # the provider is now stalled mid-answer

    try:
        task = asyncio.create_task(consume())
        await asyncio.wait_for(streaming.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def cancelled() -> bool:
            return (await async_client.get_run(run_ids[0])).status == "cancelled"

        async def hung_up() -> bool:
            return fake_openai.chat_disconnects == hangups + 1

        await _apoll(cancelled, "the host to record the run as cancelled")
        await _apoll(hung_up, "the provider hang-up")
        record = await async_client.get_run(run_ids[0])
        assert record.error_code == "CANCELLED"
        assert record.result is None
        assert fake_openai.chat_requests_count == calls + 1  # the provider was not called again
    finally:
        fake_openai.set_chat_mode("ok")


def test_a_failed_search_fallback_is_sent_and_its_outcome_read_back(api: ClientApi) -> None:
    reply = "That document is not available to you."
    request = GROUNDED.model_copy(
        update={
            "retrieval": RunRetrieval(corpus=CORPUS, source_ids=["no-such-document"]),
            "fallbacks": Fallbacks(search_failed=FallbackAnswer(answer=reply)),
        }
    )
    result = api.run(request)
    assert result.text == reply and result.sources == []
    assert [(f.outcome, f.action) for f in result.fallbacks] == [("search-failed", "answer")]
    assert [r.outcome for r in result.receipts] == ["unavailable"]

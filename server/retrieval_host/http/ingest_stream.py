"""`POST /v1/retrieval/ingest` with `Accept: text/event-stream`: the ingest as it advances.

The stream: `ingest.started`, then `ingest.progress` events (`phase` `parse`, `embed` or
`commit`, with `passagesDone` and `passagesTotal`), heartbeat comments between them, and last
`ingest.completed` (the index result) or `ingest.failed` (a problem body). A request refused
before any parsing (authentication, grants, an unknown corpus, a bad parameter) is a plain
problem response, as without the stream.

The work runs on the policy's worker executor, as a run does; its reports cross to the event
loop through a queue (a document reports a bounded number of times: one per 64 passages). A
client that disconnects cancels the work at its next check, and the previous revision stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sse_starlette.event import ServerSentEvent
from starlette.responses import Response
from starlette.types import Scope

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import IndexResult, JSONValue
from retrieval_host.http.policy import RequestPolicy
from retrieval_host.http.problems import log_failure
from retrieval_host.http.request_id import note_stream_failure
from retrieval_host.http.shutdown import Shutdown, shutting_down
from retrieval_host.http.sse import event_stream, json_event
from retrieval_host.wire import retrieval as wire_retrieval
from retrieval_host.wire.problems import problem_body

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Done:
    result: IndexResult


_Item = dict[str, Any] | _Done | BaseException


async def streamed_ingest(
    policy: RequestPolicy,
    context: RequestContext,
    work: Callable[[RequestContext], IndexResult],
    *,
    request_id: str,
    heartbeat_s: float,
    shutdown: Shutdown | None,
    scope: Scope,
) -> Response:
    """Start `work` (the ingest, given the context that reports its progress) and answer with
    its event stream once it has passed the checks that need no parsing."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[_Item] = asyncio.Queue()

    def report(phase: str, details: Mapping[str, JSONValue]) -> None:
        event = wire_retrieval.ingest_progress_json(phase, details)
        if event is not None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

    observed = context.on_progress

    def on_progress(phase: str, details: Mapping[str, JSONValue]) -> None:
        if observed is not None:
            observed(phase, details)
        report(phase, details)

    streamed = replace(context, on_progress=on_progress)

    def run() -> None:
        try:
            outcome: _Item = _Done(work(streamed))
        except Exception as exc:  # sent as `ingest.failed` (or a problem, before the stream)
            outcome = exc
        loop.call_soon_threadsafe(queue.put_nowait, outcome)

    policy.start(run)
    try:
        first = await queue.get()
    except BaseException:
        context.cancel.cancel()
        _release(shutdown, context)
        raise
    if isinstance(first, BaseException):
        _release(shutdown, context)
        raise first  # refused before any parsing: a plain problem response

    async def events() -> AsyncGenerator[ServerSentEvent, None]:
        ended = False  # the ingest's outcome is known (its last event is being sent)
        try:
            yield _sse({"type": "ingest.started", "requestId": request_id})
            item: _Item = first
            while True:
                if isinstance(item, _Done):
                    result = wire_retrieval.index_response(item.result)
                    body = {"type": "ingest.completed", "result": result.model_dump(by_alias=True)}
                    ended = True
                    yield _sse(body)
                    return
                if isinstance(item, BaseException):
                    failed = _failed(item, request_id)
                    problem = failed["problem"]
                    note_stream_failure(scope, problem["code"], problem.get("reason"))
                    ended = True
                    yield _sse(failed)
                    return
                yield _sse(item)
                item = await _next(queue, shutdown)
        except (GeneratorExit, asyncio.CancelledError):
            if not ended:
                # The client left before the outcome: the ingest is cancelled, and the access
                # line and metrics say so, as for a run (a black-box test: a plain 200).
                note_stream_failure(scope, ErrorCode.CANCELLED.value, None)
            raise
        finally:
            # A no-op once the work ended; on a disconnect it stops the work at its next check.
            context.cancel.cancel()
            _release(shutdown, context)

    return event_stream(_closing(events()), heartbeat_s=heartbeat_s, shutdown=shutdown)


async def _next(queue: asyncio.Queue[_Item], shutdown: Shutdown | None) -> _Item:
    """The next report; past the shutdown cutoff without one, a failure that says so."""
    if shutdown is None:
        return await queue.get()
    item = await shutdown.next_item(queue)
    if item is None:
        return shutting_down()
    if (
        isinstance(item, RetrievalError)
        and item.code is ErrorCode.CANCELLED
        and shutdown.past_cutoff
    ):
        return shutting_down()
    return item


def _failed(error: BaseException, request_id: str) -> dict[str, Any]:
    if not isinstance(error, RetrievalError):
        logger.error("ingest failed", exc_info=error)
        error = RetrievalError(ErrorCode.INTERNAL, "The host failed to ingest the document.")
    else:
        log_failure(error, request_id)  # as a JSON answer's (a full disk went unnamed)
    problem = problem_body(error.code, error.detail, request_id, reason=error.reason)
    return {"type": "ingest.failed", "problem": problem}


def _sse(body: dict[str, Any]) -> ServerSentEvent:
    return json_event(body, body["type"])


async def _closing(
    events: AsyncGenerator[ServerSentEvent, None],
) -> AsyncIterator[ServerSentEvent]:
    # aclosing: the generator's cleanup (cancel the work, release it from shutdown tracking)
    # runs when the stream ends, not whenever the garbage collector gets to it.
    async with contextlib.aclosing(events):
        async for event in events:
            yield event


def _release(shutdown: Shutdown | None, context: RequestContext) -> None:
    if shutdown is not None:
        shutdown.release(context.cancel)

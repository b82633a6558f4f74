"""`POST /v1/runs` (JSON or Server-Sent Events) and `GET /v1/runs/{id}`.

The routes follow the one request policy (`policy.py`) and call only the Driver. The run
executes on the policy's worker executor; its events cross to the event loop through an unbounded
queue, bounded by the run: progress events are few, and its text by `maxGenerationSteps` calls
of at most `MAX_ANSWER_CHARS` each (`core/runs/generation.py`). A client that stops reading
does not slow the run down: its answer waits in that queue until the run ends. Text deltas the
stream has not taken yet are joined into one (`_Text`, at most `MAX_DELTA_CHARS`): a provider
streaming one character per chunk faster than the stream sends them queued an object and an
SSE event each (100 MB of events for one 16-step run, a black-box test), and the stream, never
waiting on a non-empty queue, kept the event loop from every other request, its own client's
disconnect and the host's signals for tens of seconds; it now also lets the loop run between
events.
A client that disconnects cancels the run: the worker stops at its next check, the provider
stream is closed, the record says `cancelled`, and the concurrency slot is released when this
handler returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

import anyio
from sse_starlette.event import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Scope

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs_model import (
    RunCompleted,
    RunDelta,
    RunEvent,
    RunFailed,
    RunRequest,
    RunStarted,
)
from retrieval_host.driver import Driver
from retrieval_host.http.auth import Principal, permission_denied
from retrieval_host.http.metrics import HostMetrics
from retrieval_host.http.policy import RequestPolicy
from retrieval_host.http.problems import error_response
from retrieval_host.http.request_id import note_stream_failure, request_id_of
from retrieval_host.http.shutdown import Shutdown, shutting_down
from retrieval_host.http.sse import event_stream, json_event, wants_stream
from retrieval_host.http.strict import no_query_params
from retrieval_host.wire import runs as wire_runs
from retrieval_host_client import run_models as wire

# The most characters of text one joined `run.delta` carries.
MAX_DELTA_CHARS: Final = 64 * 1024


class _Text:
    """Text deltas the run emitted that its stream has not taken yet: the worker adds to the
    last one while it waits in the queue, the stream takes them as one `RunDelta`."""

    __slots__ = ("_lock", "_parts", "_size", "_taken")

    def __init__(self, text: str) -> None:
        self._lock = threading.Lock()
        self._parts = [text]
        self._size = len(text)
        self._taken = False

    def add(self, text: str) -> bool:
        """Join `text` to what waits, unless the stream took it already or it is full."""
        with self._lock:
            if self._taken or self._size + len(text) > MAX_DELTA_CHARS:
                return False
            self._parts.append(text)
            self._size += len(text)
            return True

    def take(self) -> RunDelta:
        with self._lock:
            self._taken = True
            return RunDelta("".join(self._parts))


Queued = RunEvent | _Text | BaseException


def _event(item: Queued) -> RunEvent | BaseException:
    return item.take() if isinstance(item, _Text) else item


def may_read_run(principal: Principal, record: RunRecord) -> bool:
    """Reading a recorded run needs what running it needed: the provider grant, and a search
    grant on the corpus its retrieval (and so its evidence) came from.

    A record written before runs kept their provider is judged by its result; one with
    neither (an early failed run) is visible to no token: there is nothing to check it by.
    """
    result = record.result
    provider = record.provider or (result.provider if result is not None else None)
    if provider is None or provider not in principal.providers:
        return False
    corpora = {record.corpus, result.corpus if result is not None else None} - {None}
    return all(principal.may("search", corpus) for corpus in corpora if corpus is not None)


class RunRoutes:
    """Run handlers, under the same request policy as the retrieval routes (authentication,
    body parsing, context and the one worker executor)."""

    def __init__(
        self,
        driver: Driver,
        policy: RequestPolicy,
        *,
        heartbeat_s: float,
        metrics: HostMetrics | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self._driver = driver
        self._policy = policy
        self._heartbeat_s = heartbeat_s
        self._metrics = metrics
        self._shutdown = shutdown

    def routes(self) -> list[Route]:
        return [
            Route("/v1/runs", self.create, methods=["POST"]),
            # `path`: a run id holding `/` (never one the host issued) is a missing run, not
            # a missing route.
            Route("/v1/runs/{run_id:path}", self.get, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = self._policy.authenticate(request)
        body = await self._policy.parse_json(request, wire.RunRequest)
        if body.provider not in principal.providers:
            raise permission_denied()
        if body.retrieval is not None and body.retrieval.mode != "off":
            # An omitted search grant denies retrieval inside an otherwise allowed run.
            principal.require("search", body.retrieval.corpus)
        run_request = wire_runs.run_request(body)
        idle = None if body.idle_timeout_ms is None else body.idle_timeout_ms / 1000
        request_id = request_id_of(request.scope)
        # Scans are observed from the run's events (`_start`), not from progress reports.
        context = self._policy.context(principal, request, idle_s=idle, observe_scans=False)
        queue = self._start(run_request, context)
        try:
            first = _event(await queue.get())
        except BaseException:
            context.cancel.cancel()
            raise
        if isinstance(first, BaseException):
            # Refused before a run existed (bad provider, reused key...): a plain problem.
            raise first

        run_id = first.run_id if isinstance(first, RunStarted) else ""

        async def events() -> AsyncGenerator[RunEvent, None]:
            try:
                item: RunEvent | BaseException = first
                while True:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if isinstance(item, RunCompleted | RunFailed):
                        return
                    if not queue.empty():
                        # A queue that is not empty never suspends: let the loop serve the
                        # other requests, this client's disconnect and signals in between.
                        await asyncio.sleep(0)
                    item = await self._next(queue, run_id)
            finally:
                # A no-op once the run finished; on a disconnect it stops the worker at its
                # next check and the run is recorded as cancelled.
                context.cancel.cancel()
                if self._shutdown is not None:
                    self._shutdown.release(context.cancel)

        if wants_stream(request):
            return event_stream(
                self._sse(events(), request_id, request.scope),
                heartbeat_s=self._heartbeat_s,
                shutdown=self._shutdown,
            )
        return await self._collect(events(), request)

    async def _next(self, queue: asyncio.Queue[Queued], run_id: str) -> RunEvent | BaseException:
        """The run's next event; past the shutdown cutoff, a final `run.failed` that says so."""
        if self._shutdown is None:
            return _event(await queue.get())
        queued = await self._shutdown.next_item(queue)
        item = None if queued is None else _event(queued)
        if item is None:
            # The worker did not end the run within the wind-down: the stream ends here.
            return RunFailed(run_id, shutting_down())
        if (
            isinstance(item, RunFailed)
            and item.error.code is ErrorCode.CANCELLED
            and self._shutdown.past_cutoff
        ):
            return RunFailed(item.run_id, shutting_down())
        return item

    def _start(self, run_request: RunRequest, context: RequestContext) -> asyncio.Queue[Queued]:
        """Run on the policy's worker executor; events cross to this loop through an unbounded
        queue (bounded by the run: see the module docstring). Not a task group: an SSE body is
        iterated in another task than the handler's, and the worker must not be tied to
        either."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        waiting: list[_Text | None] = [None]  # the last text put in the queue

        metrics = self._metrics
        scan_timer = metrics.scan_timer() if metrics is not None else None

        def emit(event: RunEvent) -> None:
            # Observed here, in the worker, so a run whose client left is still counted.
            if metrics is not None and scan_timer is not None:
                scan_timer.observe_event(event)
                metrics.observe_run_event(event)
            if isinstance(event, RunDelta):
                text = waiting[0]
                if text is not None and text.add(event.text):
                    return
                waiting[0] = text = _Text(event.text)
                loop.call_soon_threadsafe(queue.put_nowait, text)
                return
            waiting[0] = None  # text after this event is queued after it
            loop.call_soon_threadsafe(queue.put_nowait, event)

        def work() -> None:
            try:
                self._driver.execute_run(run_request, context, emit)
            except Exception as exc:  # rendered by the handler as a problem
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        self._policy.start(work)
        return queue

    async def _sse(
        self, events: AsyncGenerator[RunEvent, None], request_id: str, scope: Scope
    ) -> AsyncIterator[ServerSentEvent]:
        # aclosing: the inner generator's cleanup (cancel the run, release it from shutdown
        # tracking) runs when this stream ends, not whenever the garbage collector gets to it.
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    if isinstance(event, RunFailed):
                        note_stream_failure(scope, event.error.code.value, event.error.reason)
                    yield json_event(wire_runs.event_json(event, request_id), event.type)
        except (GeneratorExit, asyncio.CancelledError):
            # The client left before the run's last event: the run is cancelled, and the
            # access line says so (it showed a plain 200, a black-box test).
            note_stream_failure(scope, ErrorCode.CANCELLED.value, None)
            raise

    async def _collect(self, events: AsyncIterator[RunEvent], request: Request) -> Response:
        outcome: RunEvent | None = None
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch)
            async for event in events:
                outcome = event
            group.cancel_scope.cancel()
        if isinstance(outcome, RunFailed):
            # With the run's id: the failure is recorded, and `GET /v1/runs/{id}` reads it.
            return error_response(
                outcome.error, request_id_of(request.scope), run_id=outcome.run_id or None
            )
        if not isinstance(outcome, RunCompleted):
            raise RetrievalError(ErrorCode.CANCELLED, "The client disconnected.")
        body = json.dumps(wire_runs.result_to_json(outcome.result), ensure_ascii=False)
        return Response(body, media_type="application/json")

    async def get(self, request: Request) -> Response:
        principal = self._policy.authenticate(request)
        no_query_params(request.scope.get("query_string", b""))
        run_id = request.path_params["run_id"]
        context = self._policy.context(principal, request, observe_scans=False)
        record = await self._policy.run(
            request,
            context,
            lambda: self._driver.get_run(
                run_id, context, permits=lambda r: may_read_run(principal, r)
            ),
        )
        body = json.dumps(wire_runs.run_record_json(record), ensure_ascii=False)
        return Response(body, media_type="application/json")

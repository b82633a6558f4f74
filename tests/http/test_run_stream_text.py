"""Text deltas a run emits faster than its stream takes them are joined: a provider streaming one
character per chunk queued an object and an SSE event each (100 MB of events for one run, and
the stream kept the event loop from every other request; a black-box test)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.runs_model import RunDelta, RunEvent, RunFailed, RunProgress, RunStarted
from retrieval_host.http import runs

END = RunFailed("run_1", RetrievalError(ErrorCode.CANCELLED, "ended"))


class _Driver:
    def __init__(self, events: Sequence[RunEvent]) -> None:
        self.events = events

    def execute_run(
        self, request: object, context: object, emit: Callable[[RunEvent], None]
    ) -> None:
        for event in self.events:
            emit(event)


class _Policy:
    """Runs the work at once: every event is emitted before the stream takes the first."""

    def start(self, work: Callable[[], None]) -> None:
        work()


def streamed(events: Sequence[RunEvent]) -> list[RunEvent | BaseException]:
    routes = runs.RunRoutes(cast(Any, _Driver(events)), cast(Any, _Policy()), heartbeat_s=15)

    async def take() -> list[RunEvent | BaseException]:
        queue = routes._start(cast(Any, None), cast(Any, None))
        taken: list[RunEvent | BaseException] = []
        while not taken or not isinstance(taken[-1], RunFailed):
            taken.append(await routes._next(queue, "run_1"))
        return taken

    return asyncio.run(take())


def test_waiting_deltas_are_taken_as_one_in_order_with_the_other_events() -> None:
    first = [RunDelta(c) for c in "The battery lasted"]
    second = [RunDelta(c) for c in " 1,200 cycles."]
    got = streamed([RunStarted("run_1", "t"), *first, RunProgress("generation.step"), *second, END])
    assert got == [
        RunStarted("run_1", "t"),
        RunDelta("The battery lasted"),
        RunProgress("generation.step"),
        RunDelta(" 1,200 cycles."),
        END,
    ]


def test_a_joined_delta_holds_at_most_max_delta_chars() -> None:
    piece = "x" * (runs.MAX_DELTA_CHARS // 2 + 1)
    many = [RunDelta("y")] * (runs.MAX_DELTA_CHARS + 10)
    got = streamed([RunStarted("run_1", "t"), *[RunDelta(piece)] * 3, *many, END])
    texts = [e.text for e in got if isinstance(e, RunDelta)]
    assert "".join(texts) == piece * 3 + "y" * (runs.MAX_DELTA_CHARS + 10)
    # Two pieces never fit in one; the third takes the y's up to the limit, the rest follow.
    top = runs.MAX_DELTA_CHARS
    rest = top + 10 - (top - len(piece))
    assert [len(t) for t in texts] == [len(piece), len(piece), top, rest]

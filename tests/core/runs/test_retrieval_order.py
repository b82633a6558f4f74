"""The order of a run's retrieval steps (002: prepare, check input, dedup and quota, authorize,
reserve the key, execute, check the result, count, effects), pinned by what each step's
position makes observable."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import SearchRequest, SearchResult
from retrieval_host.core.run_ports import (
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallRequested,
)
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs_model import Fallbacks, RunRequest, RunRetrieval
from tests.support.run_engine import RunWorld


class Asks:
    """A model that asks for `queries` at its first step, then answers."""

    kind = "test"

    def __init__(self, queries: Sequence[str]) -> None:
        self.queries = list(queries)

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        if request.step == 1:
            for i, q in enumerate(self.queries):
                yield ToolCallRequested(
                    ToolCall(f"c{i}", "search_context", json.dumps({"query": q}))
                )
        else:
            yield TextDelta("done")


class DownOnce:
    """An application retriever whose first search fails; later ones use the host's search."""

    def __init__(self, world: RunWorld) -> None:
        self.world = world
        self.asked: list[str] = []

    def search(self, request: SearchRequest, context: RequestContext) -> SearchResult:
        self.asked.append(request.query)
        if len(self.asked) == 1:
            raise RetrievalError(ErrorCode.STORE_UNAVAILABLE, "the engine is down")
        return self.world.service.search_context(request, context)


Receipts = list[tuple[str, str | None]]


def run(
    world: RunWorld, queries: Sequence[str], subject: str = "alice"
) -> tuple[Receipts, DownOnce]:
    retriever = DownOnce(world)
    engine = RunEngine(
        world.service,
        {"asks": Asks(queries)},
        world.runs,
        retriever=retriever,
    )
    request = RunRequest(
        provider="asks",
        model="m",
        input="q",
        retrieval=RunRetrieval(corpus="library", mode="tool", max_queries=5, limit=1),
        fallbacks=Fallbacks(no_evidence="continue", search_failed="continue"),
    )
    result = engine.run(request, RequestContext(subject))
    return [(r.status, r.error_code) for r in result.receipts], retriever


def test_input_is_checked_before_dedup_and_a_failed_execute_keeps_its_key(
    run_world: RunWorld,
) -> None:
    receipts, retriever = run(run_world, ["   ", " ", "battery", "battery ", "solar"])
    assert receipts == [
        # Blank twice: both refused by the input check, neither a duplicate (input before dedup).
        ("failed", "INVALID_REQUEST"),
        ("failed", "INVALID_REQUEST"),
        # Executed and failed: its key was reserved before the call, so the repeat (equal once
        # normalized) is a duplicate and the search is not made again.
        ("failed", "STORE_UNAVAILABLE"),
        ("duplicate", None),
        ("ok", None),
    ]
    assert retriever.asked == ["battery", "solar"]


def test_authorization_comes_before_execution_and_a_denial_keeps_its_key(
    run_world: RunWorld,
) -> None:
    receipts, retriever = run(run_world, ["battery", "battery"], subject="bob")
    # Denied before anything is read (the retriever is never asked); the denied query is not
    # asked again within the run (the documented deviation from 002: the key is reserved).
    assert receipts == [("failed", "PERMISSION_DENIED"), ("duplicate", None)]
    assert retriever.asked == []

"""The retrieval lifecycle's runner: the steps in their one order, the cancel token between
them, effects after a success (a failing or non-JSON one stops the rest and is reported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lifecycle import run_retrieval
from retrieval_host.core.models import JSONValue
from retrieval_host.core.runs import RunEngine


@dataclass
class Steps:
    """A retrieval that records its steps; `cancel_at` cancels the caller during that step."""

    name: str = "recorded"
    seen: list[str] = field(default_factory=list)
    cancel_at: str | None = None
    refuse: bool = False

    def _step(self, step: str, context: RequestContext) -> None:
        self.seen.append(step)
        if step == self.cancel_at:
            context.cancel.cancel()

    def prepare(self, request: str, context: RequestContext) -> str:
        self._step("prepare", context)
        return request.strip()

    def assert_input(self, prepared: str) -> None:
        self.seen.append("assert_input")
        if not prepared:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "empty")

    def authorize(self, prepared: str, context: RequestContext) -> int:
        self._step("authorize", context)
        if self.refuse:
            raise RetrievalError(ErrorCode.PERMISSION_DENIED, "no")
        return 7

    def execute(self, prepared: str, grant: int, context: RequestContext) -> list[str]:
        self._step("execute", context)
        return [prepared] * grant

    def assert_result(
        self, prepared: str, grant: int, found: list[str], context: RequestContext
    ) -> tuple[str, ...]:
        self._step("assert_result", context)
        return tuple(found[:2])


@dataclass
class Returns:
    name: str
    value: object
    calls: list[str]

    def after(self, result: tuple[str, ...], context: RequestContext) -> JSONValue:
        self.calls.append(self.name)
        if isinstance(self.value, Exception):
            raise self.value
        return self.value  # type: ignore[return-value]


def test_the_steps_run_in_their_one_order_then_the_effects() -> None:
    steps, calls = Steps(), list[str]()
    effects = [Returns("a", {"n": 1}, calls), Returns("b", [1, 2], calls)]
    done = run_retrieval(steps, " q ", RequestContext(subject="s"), effects)
    assert steps.seen == ["prepare", "assert_input", "authorize", "execute", "assert_result"]
    assert done.result == ("q", "q")
    assert dict(done.extensions) == {"a": {"n": 1}, "b": [1, 2]}
    assert done.effect_error is None and calls == ["a", "b"]


def test_a_refused_input_or_caller_stops_before_anything_is_read() -> None:
    steps = Steps()
    with pytest.raises(RetrievalError) as refused:
        run_retrieval(steps, "  ", RequestContext(subject="s"))
    assert refused.value.code is ErrorCode.INVALID_REQUEST
    assert steps.seen == ["prepare", "assert_input"]
    denied = Steps(refuse=True)
    with pytest.raises(RetrievalError):
        run_retrieval(denied, "q", RequestContext(subject="s"))
    assert denied.seen[-1] == "authorize" and "execute" not in denied.seen


@pytest.mark.parametrize(
    ("step", "last"),
    [("prepare", "assert_input"), ("authorize", "authorize"), ("execute", "execute")],
)
def test_a_cancelled_caller_stops_before_the_next_step(step: str, last: str) -> None:
    steps = Steps(cancel_at=step)
    with pytest.raises(RetrievalError) as cancelled:
        run_retrieval(steps, "q", RequestContext(subject="s", cancel=CancelToken()))
    assert cancelled.value.code is ErrorCode.CANCELLED
    assert steps.seen[-1] == last


@pytest.mark.parametrize("bad", [ValueError("boom"), {1, 2}])
def test_a_failing_effect_stops_the_later_ones_and_is_reported_not_raised(bad: object) -> None:
    calls: list[str] = []
    effects = [Returns("a", 1, calls), Returns("b", bad, calls), Returns("c", 3, calls)]
    done = run_retrieval(Steps(), "q", RequestContext(subject="s"), effects)
    assert calls == ["a", "b"]
    assert dict(done.extensions) == {"a": 1}
    expected = "ValueError" if isinstance(bad, Exception) else "TypeError"
    assert done.effect_error == {"effect": "b", "error": expected}
    assert done.result == ("q", "q")  # the retrieval's result stands


def test_two_effects_of_one_name_are_refused_before_anything_runs() -> None:
    # A black-box test: the second's value replaced the first's in `extensions`, silently.
    steps, calls = Steps(), list[str]()
    effects = [Returns("dup", 1, calls), Returns("dup", 2, calls), Returns("ok", 3, calls)]
    with pytest.raises(ValueError, match="'dup' twice"):
        run_retrieval(steps, "q", RequestContext(subject="s"), effects)
    assert steps.seen == [] and calls == []
    # A run engine's effects likewise, when it is made.
    with pytest.raises(ValueError, match="'dup' twice"):
        RunEngine(None, {}, cast(Any, None), effects=cast(Any, effects))

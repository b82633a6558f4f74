"""The retrieval lifecycle: one fixed order of steps for every retrieval, the host's own search
and an application's own retrievals alike (pure).

    prepare -> assert input -> authorize -> execute -> assert result -> effects

- **prepare** normalizes the request (deduplicate ids, parse filters, resolve the corpus);
- **assert input** refuses a malformed request with a typed error, before anything is asked
  of the application or read;
- **authorize** asks the application what the caller may read now; a denied caller learns
  nothing more (its error is the same whether the thing exists or not);
- **execute** reads and ranks only what was authorized;
- **assert result** checks what was read against the grant as it is after the read (a
  revocation in between removes, never adds) and shapes the result;
- **effects**, the application's, run in order after a success; the first that fails stops
  the later ones and is reported with the result, not raised, and nothing that ran before it
  is undone.

`run_retrieval` is the one runner: it checks the caller's cancel token between steps and
returns the result with what the effects added. `RetrievalService.search_context` is
`run_retrieval(CorpusSearch(...), ...)`, so a grounded run's searches, which go through it,
take this path too. An application defines its own retrieval as a `Retrieval` and runs it with
`Driver.retrieve` (see `examples/custom_retrieval.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import JSONValue

RequestT_contra = TypeVar("RequestT_contra", contravariant=True)
PreparedT = TypeVar("PreparedT")
GrantT = TypeVar("GrantT")
FoundT = TypeVar("FoundT")
ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)
ResultT_contra = TypeVar("ResultT_contra", contravariant=True)


class Retrieval(Protocol[RequestT_contra, PreparedT, GrantT, FoundT, ResultT_co]):
    """The steps of one kind of retrieval; `run_retrieval` calls them in order. Each may raise
    a `RetrievalError` (that ends the retrieval with it); the types between steps are the
    retrieval's own."""

    @property
    def name(self) -> str: ...

    def prepare(self, request: RequestT_contra, context: RequestContext) -> PreparedT: ...

    def assert_input(self, prepared: PreparedT) -> None: ...

    def authorize(self, prepared: PreparedT, context: RequestContext) -> GrantT: ...

    def execute(self, prepared: PreparedT, grant: GrantT, context: RequestContext) -> FoundT: ...

    def assert_result(
        self, prepared: PreparedT, grant: GrantT, found: FoundT, context: RequestContext
    ) -> ResultT_co: ...


class Effect(Protocol[ResultT_contra]):
    """Runs after a successful retrieval; what it returns (JSON) is kept under its `name`."""

    @property
    def name(self) -> str: ...

    def after(self, result: ResultT_contra, context: RequestContext) -> JSONValue: ...


@dataclass(frozen=True, slots=True)
class Retrieved(Generic[ResultT]):
    """A retrieval's result, what each effect returned (by name, in order), and the first
    effect that failed (its name and exception type; its message may hold anything)."""

    result: ResultT
    extensions: Mapping[str, JSONValue] = field(default_factory=dict)
    effect_error: Mapping[str, str] | None = None


def check_effect_names(names: Iterable[str]) -> None:
    """`ValueError` when two effects share a name: their values are kept by name."""
    listed = list(names)
    repeated = sorted({name for name in listed if listed.count(name) > 1})
    if repeated:
        raise ValueError(f"effects need distinct names: {', '.join(map(repr, repeated))} twice")


def run_retrieval(
    retrieval: Retrieval[RequestT_contra, PreparedT, GrantT, FoundT, ResultT],
    request: RequestT_contra,
    context: RequestContext,
    effects: Sequence[Effect[ResultT]] = (),
) -> Retrieved[ResultT]:
    """Run `retrieval`'s steps in the lifecycle's order, then `effects` (module docstring).
    Effects are keyed by name in `extensions`: two of one name are the caller's `ValueError`,
    before anything runs (the second's value replaced the first's, a black-box test)."""
    check_effect_names(effect.name for effect in effects)
    prepared = retrieval.prepare(request, context)
    retrieval.assert_input(prepared)
    context.cancel.check()
    grant = retrieval.authorize(prepared, context)
    context.cancel.check()
    found = retrieval.execute(prepared, grant, context)
    context.cancel.check()
    result = retrieval.assert_result(prepared, grant, found, context)
    extensions: dict[str, JSONValue] = {}
    for effect in effects:
        try:
            value = effect.after(result, context)
            json.dumps(value, allow_nan=False)  # kept with the result: it must be JSON
        except Exception as error:  # an application effect's failure is reported, not raised
            failed = {"effect": effect.name, "error": type(error).__name__}
            return Retrieved(result, extensions, failed)
        extensions[effect.name] = value
    return Retrieved(result, extensions)

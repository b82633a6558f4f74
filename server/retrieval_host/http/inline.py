"""Which searches run on the event loop itself: short ones that call no model.

A search handed to a thread pays for the handoff in a way its own work does not show. Python
runs one thread at a time: the search thread and the event loop pass the interpreter back and
forth at every SQLite call and every numpy call that lets go of it, each pass a wake-up and a
context switch. Measured on two cores against the quickstart host, 16 clients repeating 32
questions (their query vectors cached): 2.4 ms of host CPU per search on the search threads,
1.3 ms on the loop, 1.75x the searches a second (`bench/README.md`, session 25). In-process,
two threads searching at once each took twice the CPU of one thread alone.

So with `limits.searchThreads` (the operator's word that every part of a search runs in this
process) and `limits.inlineSearchMs` > 0, a search that calls no model (`Driver.
search_calls_no_model`: lexical, or a query vector already cached, no reranker) runs where
its request is handled, while such searches of its kind have averaged at most that budget.
It runs inside `core.waits.refusing_waits()`: where it would wait (its query vector evicted
meanwhile, the store's index to reload after another connection's commit, a lock a writer
holds past `core.waits.LOCK_PATIENCE_S`) it stops with `WouldWait` and runs again, whole, on
a search thread. What is left on the loop is mostly the search's own work, which the average
bounds (and short waits: a lock within its patience, the authorizer's own file reads).

A kind is (corpus, subject, mode, scope): one subject's grant may cover a hundred times the
rows of another's, lexical and hybrid searches cost differently, and a search naming a few
sources (or filtering) costs less than one of the whole grant (a black-box test: a kind kept
cheap by searches of one source let a whole-namespace search of 21,500 passages hold the loop
up for 16-112 ms; the scope is whether the search names its sources, about how many (at most
1, 10, 100 or more), and whether it filters).
So the loop is held up by at most about one search of a kind that averages within the
budget. Its average is of every such search, whichever way it ended: the thread's CPU time
for one on a search thread (the waits it may have there are not what it would cost the
loop), the elapsed time for one on the loop (what it held the loop up for). A kind starts
with no average, so its first search runs on a thread; a search on the loop that took more
than about five budgets moves the average past the budget at once (a weight of `WEIGHT`),
and searches on threads bring it back. At most
`KINDS` kinds are kept, the least recently used forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from retrieval_host.core.models import SearchRequest

__all__ = ["KINDS", "WEIGHT", "InlineSearches", "Kind", "kind_of"]

# The weight of the newest observation in a kind's moving average.
WEIGHT: Final = 0.2
KINDS: Final = 4096

Kind = tuple[str, str, str, str]  # corpus, subject, mode, scope


def _size_class(count: int) -> str:
    return "<=1" if count <= 1 else "<=10" if count <= 10 else "<=100" if count <= 100 else ">100"


def kind_of(request: SearchRequest, subject: str) -> Kind:
    """The kind of a search (module docstring)."""
    named = request.source_ids
    scope = "granted" if named is None else f"named{_size_class(len(named))}"
    if request.filters:
        scope += "+filtered"
    return (request.corpus, subject, request.mode, scope)


class InlineSearches:
    """The moving averages per kind and the choice they make. Event-loop thread only."""

    def __init__(self, budget_ms: float, *, kinds: int = KINDS) -> None:
        if budget_ms < 0 or kinds < 1:
            raise ValueError("budget_ms must be at least 0 and kinds at least 1")
        self._budget_s = budget_ms / 1000
        self._kinds = kinds
        self._average_s: OrderedDict[Kind, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._budget_s > 0

    def allows(self, kind: Kind) -> bool:
        """Whether a search of this kind that calls no model may run on the loop now."""
        average = self._average_s.get(kind)
        return average is not None and average <= self._budget_s

    def observe(self, kind: Kind, seconds: float) -> None:
        """One such search's cost (see the module docstring for which time)."""
        average = self._average_s.pop(kind, None)
        self._average_s[kind] = (
            seconds if average is None else average + WEIGHT * (seconds - average)
        )
        while len(self._average_s) > self._kinds:
            self._average_s.popitem(last=False)

    def average_ms(self, kind: Kind) -> float | None:
        """The kind's current average in milliseconds (None before its first search)."""
        average = self._average_s.get(kind)
        return None if average is None else average * 1000

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
search_calls_no_model`: lexical, or a query vector already cached, and no reranker) runs
where its request is handled, while the corpus's such searches have averaged at most that
budget. Searches that embed a query keep their threads: the model's time would hold every
other request up.

The average is kept per corpus, of every search that called no model: the thread's CPU time
for one on a search thread (waiting for the interpreter is not its cost), the elapsed time for
one on the loop (what it held the loop up for, waits included). A corpus starts with no
average, so its first such search runs on a thread; one long search on the loop moves the
average past the budget at once (a weight of `WEIGHT`), and searches on threads bring it back.
"""

from __future__ import annotations

from typing import Final

__all__ = ["WEIGHT", "InlineSearches"]

# The weight of the newest observation in a corpus's moving average.
WEIGHT: Final = 0.2


class InlineSearches:
    """The per-corpus averages and the choice they make. Event-loop thread only."""

    def __init__(self, budget_ms: float) -> None:
        if budget_ms < 0:
            raise ValueError("budget_ms must be at least 0")
        self._budget_s = budget_ms / 1000
        self._average_s: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self._budget_s > 0

    def allows(self, corpus: str) -> bool:
        """Whether a search of `corpus` that calls no model may run on the loop now."""
        average = self._average_s.get(corpus)
        return average is not None and average <= self._budget_s

    def observe(self, corpus: str, seconds: float) -> None:
        """One such search's cost (see the module docstring for which time)."""
        average = self._average_s.get(corpus)
        self._average_s[corpus] = (
            seconds if average is None else average + WEIGHT * (seconds - average)
        )

    def average_ms(self, corpus: str) -> float | None:
        """The corpus's current average in milliseconds (None before its first search)."""
        average = self._average_s.get(corpus)
        return None if average is None else average * 1000

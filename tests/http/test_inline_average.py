"""`InlineSearches`: which searches that call no model may run on the event loop."""

from __future__ import annotations

import pytest

from retrieval_host.http.inline import WEIGHT, InlineSearches


def test_a_corpus_without_an_average_runs_its_first_search_on_a_thread() -> None:
    inline = InlineSearches(2.0)
    assert inline.enabled
    assert not inline.allows("docs")
    assert inline.average_ms("docs") is None
    inline.observe("docs", 0.001)
    assert inline.allows("docs")
    assert inline.average_ms("docs") == pytest.approx(1.0)
    assert not inline.allows("other")  # each corpus has its own


def test_one_long_search_turns_the_loop_off_and_short_ones_bring_it_back() -> None:
    inline = InlineSearches(2.0)
    inline.observe("docs", 0.0005)
    inline.observe("docs", 0.050)  # 50 ms on the loop
    assert inline.average_ms("docs") == pytest.approx(0.5 + WEIGHT * 49.5)
    assert not inline.allows("docs")
    short = 0
    while not inline.allows("docs"):
        inline.observe("docs", 0.0005)
        short += 1
    # Each short search takes a fifth off the distance: ~9 to get from ~10.4 ms to 2 ms.
    assert 5 <= short <= 12
    assert inline.average_ms("docs") == pytest.approx(2.0, abs=0.6)


def test_a_budget_of_zero_is_off_and_a_negative_one_is_refused() -> None:
    assert not InlineSearches(0).enabled
    with pytest.raises(ValueError, match="at least 0"):
        InlineSearches(-1)


def test_a_search_exactly_at_the_budget_still_runs_on_the_loop() -> None:
    inline = InlineSearches(2.0)
    inline.observe("docs", 0.002)
    assert inline.allows("docs")
    inline.observe("docs", 0.0021)
    assert not inline.allows("docs")

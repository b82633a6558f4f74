"""`InlineSearches`: which searches that call no model may run on the event loop."""

from __future__ import annotations

import pytest

from retrieval_host.http.inline import WEIGHT, InlineSearches

DOCS = ("docs", "alice", "lexical")


def test_a_kind_without_an_average_runs_its_first_search_on_a_thread() -> None:
    inline = InlineSearches(2.0)
    assert inline.enabled
    assert not inline.allows(DOCS)
    assert inline.average_ms(DOCS) is None
    inline.observe(DOCS, 0.001)
    assert inline.allows(DOCS)
    assert inline.average_ms(DOCS) == pytest.approx(1.0)
    # Each kind has its own: another corpus, subject or mode starts without one.
    for other in (
        ("other", "alice", "lexical"),
        ("docs", "bob", "lexical"),
        ("docs", "alice", "hybrid"),
    ):
        assert not inline.allows(other)


def test_one_long_search_turns_the_loop_off_and_short_ones_bring_it_back() -> None:
    inline = InlineSearches(2.0)
    inline.observe(DOCS, 0.0005)
    inline.observe(DOCS, 0.050)  # 50 ms on the loop
    assert inline.average_ms(DOCS) == pytest.approx(0.5 + WEIGHT * 49.5)
    assert not inline.allows(DOCS)
    short = 0
    while not inline.allows(DOCS):
        inline.observe(DOCS, 0.0005)
        short += 1
    # Each short search takes a fifth off the distance: ~9 to get from ~10.4 ms to 2 ms.
    assert 5 <= short <= 12
    assert inline.average_ms(DOCS) == pytest.approx(2.0, abs=0.6)


def test_at_most_so_many_kinds_are_kept_the_least_recently_observed_forgotten() -> None:
    inline = InlineSearches(2.0, kinds=2)
    kinds = [("docs", subject, "lexical") for subject in ("a", "b", "c")]
    inline.observe(kinds[0], 0.001)
    inline.observe(kinds[1], 0.001)
    inline.observe(kinds[0], 0.001)  # "a" used again: "b" is now the oldest
    inline.observe(kinds[2], 0.001)
    assert [inline.average_ms(k) is not None for k in kinds] == [True, False, True]


def test_a_budget_of_zero_is_off_and_bad_values_are_refused() -> None:
    assert not InlineSearches(0).enabled
    with pytest.raises(ValueError, match="at least 0"):
        InlineSearches(-1)
    with pytest.raises(ValueError, match="at least 1"):
        InlineSearches(2.0, kinds=0)


def test_a_search_exactly_at_the_budget_still_runs_on_the_loop() -> None:
    inline = InlineSearches(2.0)
    inline.observe(DOCS, 0.002)
    assert inline.allows(DOCS)
    inline.observe(DOCS, 0.0021)
    assert not inline.allows(DOCS)

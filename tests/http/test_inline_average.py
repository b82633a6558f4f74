"""`InlineSearches`: which searches that call no model may run on the event loop."""

from __future__ import annotations

import pytest

from retrieval_host.core.models import SearchRequest
from retrieval_host.http.inline import WEIGHT, InlineSearches, kind_of

DOCS = ("docs", "alice", "lexical", "granted")


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
        ("other", "alice", "lexical", "granted"),
        ("docs", "bob", "lexical", "granted"),
        ("docs", "alice", "hybrid", "granted"),
        ("docs", "alice", "lexical", "named<=1"),
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
    kinds = [("docs", subject, "lexical", "granted") for subject in ("a", "b", "c")]
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


def test_a_search_naming_its_sources_or_filtering_is_a_kind_of_its_own() -> None:
    # One source's searches must not vouch for the whole grant's (a black-box test: a kind
    # kept cheap that way let a whole-namespace search hold the loop up for 16-112 ms).
    def kind(**fields: object) -> tuple[str, str, str, str]:
        return kind_of(SearchRequest("docs", "q", mode="lexical", **fields), "alice")  # type: ignore[arg-type]

    assert kind() == ("docs", "alice", "lexical", "granted")
    assert kind(source_ids=["a"]) == ("docs", "alice", "lexical", "named<=1")
    assert kind(filters={"lang": "en"}) == ("docs", "alice", "lexical", "granted+filtered")
    assert kind(source_ids=[], filters={"lang": "en"})[3] == "named<=1+filtered"
    # About how many it names: a search of 500 sources is not vouched for by one of 2.
    sizes = {kind(source_ids=[str(n) for n in range(count)])[3] for count in (2, 10, 11, 500)}
    assert sizes == {"named<=10", "named<=100", "named>100"}

"""Who may read a run record: the provider it ran with and the search grant of its corpus;
records of the previous release are judged by their result, or hidden."""

from __future__ import annotations

from retrieval_host.core.run_ports import RunRecord
from retrieval_host.http.auth import Principal
from retrieval_host.http.runs import may_read_run
from tests.support.run_records import a_result


def principal(providers: tuple[str, ...], search: tuple[str, ...]) -> Principal:
    return Principal("alice", frozenset(providers), frozenset(search), frozenset(), frozenset())


def test_reading_a_run_needs_its_provider_and_the_search_grant_of_its_corpus() -> None:
    recorded = RunRecord("r", "alice", None, "fp", "failed", "t", provider="fake", corpus="docs")
    assert may_read_run(principal(("fake",), ("docs",)), recorded)
    assert not may_read_run(principal((), ("docs",)), recorded)
    assert not may_read_run(principal(("fake",), ()), recorded)
    assert not may_read_run(principal(("local",), ("docs", "other")), recorded)
    # Without retrieval, the provider grant is all it needed.
    plain = RunRecord("r", "alice", None, "fp", "completed", "t", provider="fake")
    assert may_read_run(principal(("fake",), ()), plain)


def test_records_of_the_previous_release_are_judged_by_their_result_or_hidden() -> None:
    old_done = RunRecord("r", "alice", "k", "fp", "completed", "t", a_result("r"))
    assert may_read_run(principal(("local",), ("docs",)), old_done)
    assert not may_read_run(principal(("local",), ()), old_done)
    assert not may_read_run(principal((), ("docs",)), old_done)
    # An old failed run has no provider to check: no token reads it.
    old_failed = RunRecord("r", "alice", "k", "fp", "failed", "t", error_code="PROVIDER_FAILED")
    assert not may_read_run(principal(("local", "fake"), ("docs",)), old_failed)

"""The host's citation check of an answer: markers, manifest membership, a required citation,
and quotes placed next to a citation, each failure typed, the report per cited passage."""

from __future__ import annotations

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import EvidencePassage
from retrieval_host.core.runs.citations import check_citations
from retrieval_host.core.runs_model import CitationPolicy, CitedSource, QuoteCheck

EVIDENCE = {
    "battery-1": EvidencePassage(
        "battery-1",
        "battery",
        "r1",
        "Battery report",
        Location(page=3),
        "The measured battery lifetime was 1,200 charge cycles\nat 25 degrees.",
    ),
    "solar-1": EvidencePassage(
        "solar-1", "solar", "r1", "Solar survey", Location(), "Panel output fell by half a percent."
    ),
}
CHECK = CitationPolicy()


def failure(text: str, policy: CitationPolicy = CHECK) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        check_citations(text, EVIDENCE, policy)
    assert excinfo.value.code is ErrorCode.INVALID_CITATION
    assert excinfo.value.status == 422
    return excinfo.value


def test_quotes_next_to_each_citation_are_found_in_that_passage_whitespace_normalized() -> None:
    text = (
        'The report found "1,200 charge   cycles at 25 degrees" [source:battery-1], while '
        "“Panel output fell” [source:solar-1]. Both hold [source:battery-1]."
    )
    report = check_citations(text, EVIDENCE, CHECK)
    assert report.cited == [
        CitedSource("battery-1", (QuoteCheck("1,200 charge   cycles at 25 degrees", True),)),
        CitedSource("solar-1", (QuoteCheck("Panel output fell", True),)),
    ]


def test_a_quote_the_cited_passage_lacks_fails_and_says_where_not_what() -> None:
    text = 'It lasts "2,000 charge cycles" [source:battery-1].'
    error = failure(text)
    assert error.reason == "quote-not-in-passage"
    assert "2,000" not in error.detail and "[source:battery-1]" in error.detail
    # A quote belongs to the citation next to it, not to another passage that holds it.
    error = failure('"Panel output fell" [source:battery-1] [source:solar-1]')
    assert error.reason == "quote-not-in-passage"
    # Case counts: the passage is quoted as written.
    assert failure('"panel output fell" [source:solar-1]').reason == "quote-not-in-passage"
    # With quotes reported only, the run passes and the report says which were not found.
    report = check_citations(text, EVIDENCE, CitationPolicy(quotes=False))
    assert report.cited == [CitedSource("battery-1", (QuoteCheck("2,000 charge cycles", False),))]


def test_markers_must_be_well_formed_and_in_the_manifest() -> None:
    assert failure("See [source: battery-1].").reason == "malformed-marker"
    assert failure("See [Source:battery-1").reason == "malformed-marker"
    # Spaced markers too, as the client's check refuses them (found by review: the host let
    # `[ source:x]` through while the client refused it).
    assert failure("See [ source:evil-id].").reason == "malformed-marker"
    assert failure("See [source :battery-1].").reason == "malformed-marker"
    error = failure("See [source:vault-1].")
    assert error.reason == "unknown-source" and "vault-1" in error.detail


def test_a_required_citation_must_be_there_and_an_optional_one_need_not() -> None:
    assert failure("No citation at all.").reason == "no-citation"
    assert check_citations("No citation.", EVIDENCE, CitationPolicy(require=False)).cited == []
    # Not required, but what is cited is still checked.
    assert failure("See [source:nope].", CitationPolicy(require=False)).reason == "unknown-source"


def test_a_quote_on_an_earlier_line_is_not_next_to_the_citation() -> None:
    text = '"Something nobody said"\nThe lifetime is long [source:battery-1].'
    report = check_citations(text, EVIDENCE, CHECK)
    assert report.cited == [CitedSource("battery-1", ())]


def test_a_quote_of_a_passage_holding_a_marker_is_found_as_the_model_was_shown_it() -> None:
    # A passage's own `[source:` reaches a model, and the extractive provider's quotes, as
    # `(source:` (`core.evidence.defang`): a faithful quote of it failed the host's own check.
    manual = EvidencePassage(
        "manual-1",
        "manual",
        "r1",
        "Wombat manual",
        Location(start_line=1, end_line=1),
        'The manual says "see [source:appendix-b] for burrow depth" in chapter two.',
    )
    text = 'It says "see (source:appendix-b] for burrow depth" [source:manual-1].'
    report = check_citations(text, {"manual-1": manual}, CHECK)
    assert report.cited == [
        CitedSource("manual-1", (QuoteCheck("see (source:appendix-b] for burrow depth", True),))
    ]
    # What the passage does not say still fails.
    wrong = 'It says "see (source:appendix-c] for burrow depth" [source:manual-1].'
    with pytest.raises(RetrievalError, match="quote at character"):
        check_citations(wrong, {"manual-1": manual}, CHECK)


def test_quotes_belong_to_their_own_marker_on_one_long_line_and_after_a_line_break() -> None:
    # Many markers on one line: each quote is judged against the marker right after it only.
    pairs = ['"Panel output fell" [source:solar-1]', '"1,200 charge cycles" [source:battery-1]']
    text = " and ".join(pairs * 500)
    report = check_citations(text, EVIDENCE, CHECK)
    assert [(c.id, len(c.quotes)) for c in report.cited] == [
        ("solar-1", 500),
        ("battery-1", 500),
    ]
    # A quote on an earlier line belongs to no marker of a later one.
    spread = '"not in any passage"\nThen [source:solar-1].'
    assert check_citations(spread, EVIDENCE, CHECK).cited == [CitedSource("solar-1", ())]

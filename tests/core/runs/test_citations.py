"""The host's citation check of an answer: markers, manifest membership, a required citation,
and quotes placed next to a citation, each failure typed, the report per cited passage."""

from __future__ import annotations

import itertools
import random
import re
import threading
import unicodedata
from typing import Any

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import EvidencePassage
from retrieval_host.core.runs import citations
from retrieval_host.core.runs.citations import check_citations
from retrieval_host.core.runs_model import CitationPolicy, CitationReport, CitedSource, QuoteCheck

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


def pdf_evidence(text: str) -> dict[str, EvidencePassage]:
    return {"pdf-1": EvidencePassage("pdf-1", "pdf", "r1", "Licence", Location(page=2), text)}


def found_in(passage_text: str, quote: str) -> bool:
    """Whether `quote`, next to a citation of a passage holding `passage_text`, is found; and
    when it is not, that the check fails the answer for it."""
    answer = f'It says "{quote}" [source:pdf-1].'
    evidence = pdf_evidence(passage_text)
    report = check_citations(answer, evidence, CitationPolicy(quotes=False))
    (cited,) = report.cited
    (check,) = cited.quotes
    assert check.text == quote
    if check.found:
        assert check_citations(answer, evidence, CHECK).cited == report.cited
    else:
        with pytest.raises(RetrievalError, match="quote at character 8 ") as excinfo:
            check_citations(answer, evidence, CHECK)
        assert excinfo.value.reason == "quote-not-in-passage"
    return check.found


def test_a_ligature_glyph_reads_as_its_letters_on_either_side() -> None:
    # pypdf gives a ligature glyph as U+FB01 `ﬁ`; a model quoting the plain word was refused
    # while the Markdown twin of the same licence passed (a black-box probe).
    pdf = "whose speci\ufb01cation is available to the general public"
    assert found_in(pdf, "whose specification is available")
    assert found_in(pdf, "whose speci\ufb01cation is available")
    assert found_in("whose specification is available", "speci\ufb01cation")
    assert found_in("an e\ufb03cient and \ufb02at \ufb00ect", "efficient and flat ffect")
    # Other encodings of the same text: full-width letters, a decomposed accent.
    assert found_in("the \uff30\uff24\uff26 caf\u0065\u0301 menu", "the PDF café menu")
    # Folded, not loosened: another letter, or another case, is still not in the passage.
    assert not found_in(pdf, "whose specitication")
    assert not found_in(pdf, "Whose specification")
    assert not found_in("whose specitication", "speci\ufb01cation")


def test_a_word_hyphenated_at_a_line_end_is_found_hyphenated_or_joined() -> None:
    pdf = "the same conditions they recei-\nved it, and may"
    for quote in ("they received it", "they recei-ved it", "they recei- ved it", "recei-"):
        assert found_in(pdf, quote), quote
    # Spaces around the line break, a Unicode hyphen, a soft hyphen: the same word.
    assert found_in("they recei- \n  ved it", "they received it")
    assert found_in("they recei\u2010\nved it", "they received it")
    assert found_in("they recei\u2010\nved it", "they recei\u2010ved it")
    assert found_in("they recei\u00ad\nved it", "they received it")
    assert found_in("they recei\u00ad\nved it", "they recei-ved it")
    # Several in one quote, each read its own way, with a ligature on the next line.
    two = "a recei-\nved speci-\n\ufb01cation and well-\nknown terms"
    assert found_in(two, "a received speci-fication and well-known terms")
    assert found_in(two, "a recei- ved specification and wellknown terms")
    # The quote is matched as text, not as a pattern.
    assert found_in("see (a.b* recei-\nved) [x]", "(a.b* received) [x]")
    assert not found_in("see (a.b* recei-\nved) [x]", "(axb* received) [x]")


def test_a_hyphenated_line_end_accepts_nothing_but_the_word() -> None:
    pdf = "the same conditions they recei-\nved it, and may"
    for quote in (
        "they receiXved it",  # a letter where the break is
        "they recei ved it",  # the hyphen dropped but the halves kept apart
        "they receved it",  # a letter lost
        "they recei--ved it",
        "they recei-Xved it",
        "they Received it",
    ):
        assert not found_in(pdf, quote), quote
    # Only at a line end between word characters: a hyphen mid-line, a dash before a line
    # break and a hyphen before a blank line are text as written.
    assert not found_in("a well-known term", "a wellknown term")
    assert not found_in("the rest -\nand more", "the rest and more")
    assert found_in("the rest -\nand more", "the rest - and more")
    assert not found_in("the rest-\n\nand more", "the restand more")


def test_a_soft_hyphen_no_reader_sees_is_ignored_on_either_side() -> None:
    assert found_in("a speci\u00adfication", "a specification")
    assert found_in("a specification", "a speci\u00adfication")
    assert not found_in("a speci\u00adfication", "a speciXfication")


def test_hyphenated_line_ends_are_read_each_its_own_way_and_nothing_else() -> None:
    # Against every reading spelled out: passages of line pieces joined by `-` and a line break
    # (between two letters: joined, `-` or `- `; next to a digit or `²`: `-` or `- ` only),
    # quotes cut from one reading (some with a character changed) or made up. `²` and `2` are
    # different characters to the reference, as to the check.
    rng = random.Random(35)
    for _ in range(2000):
        lines = [_line(rng) for _ in range(rng.randint(2, 4))]
        joins = [
            ("", "-", "- ") if before[-1].isalpha() and after[0].isalpha() else ("-", "- ")
            for before, after in itertools.pairwise(lines)
        ]
        readings = [
            lines[0] + "".join(r + line for r, line in zip(choice, lines[1:], strict=True))
            for choice in itertools.product(*joins)
        ]
        cut = rng.choice(readings)
        start = rng.randrange(len(cut))
        quote = list(cut[start : rng.randint(start + 1, len(cut))])
        if rng.random() < 0.5:
            quote[rng.randrange(len(quote))] = rng.choice("ab12\u00b2- ")
        if rng.random() < 0.2:
            quote = [rng.choice("ab12\u00b2- ") for _ in range(rng.randint(1, 6))]
        said = " ".join("".join(quote).split())
        if not said:
            continue
        expected = any(said in reading for reading in readings)
        assert found_in("-\n".join(lines), said) is expected, (lines, said)


def _line(rng: random.Random) -> str:
    """A piece of a line that starts and ends with a word character, so each join is a line-end
    hyphen: between letters a word's, else a range's."""
    middle = "".join(rng.choice(_LINE_CHARACTERS + "- -") for _ in range(rng.randint(0, 5)))
    first, last = rng.choice(_LINE_CHARACTERS), rng.choice(_LINE_CHARACTERS)
    return " ".join(f"{first}{middle}{last}".split())


_LINE_CHARACTERS = "ab1\u00b2"


def test_superscripts_and_subscripts_are_kept_not_read_as_plain_digits_or_letters() -> None:
    # A black-box probe: NFKC read `10⁶` as `106`, so a quote with another number passed.
    assert not found_in("the limit is 10\u2076 bytes", "limit is 106 bytes")
    assert found_in("the limit is 10\u2076 bytes", "limit is 10\u2076 bytes")
    assert not found_in("the limit is 106 bytes", "limit is 10\u2076 bytes")
    assert not found_in("raised to 2\u00b3", "raised to 23")
    assert not found_in("x\u00b2 growth", "x2 growth")
    # Subscripts and superscript letters alike: a quote writes them as the passage does.
    assert not found_in("H\u2082O is water", "H2O is water")
    assert found_in("H\u2082O is water", "H\u2082O is water")
    assert not found_in("x\u207f and Acme\u2122", "xn and AcmeTM")
    assert found_in("x\u207f and Acme\u2122", "x\u207f and Acme\u2122")
    # Next to them, every other compatibility form still folds: a ligature, full-width digits
    # and letters, a decomposed accent.
    passage = "an e\ufb03cient \uff11\uff10\u2076 ops caf\u0065\u0301\u00b2 \uff30\u2082"
    assert found_in(passage, "an efficient 10\u2076 ops caf\u00e9\u00b2 P\u2082")
    assert not found_in(passage, "an efficient 106 ops")


def test_superscripts_and_subscripts_are_found_in_their_blocks_only() -> None:
    # The check finds them in a few Unicode blocks (a scan of all of it is too slow for each
    # start): a Python whose Unicode adds one elsewhere must add its block.
    everywhere = {
        chr(code)
        for code in range(0x110000)
        if unicodedata.decomposition(chr(code)).startswith(("<super>", "<sub>"))
    }
    assert everywhere == citations._SUPER_SUB
    assert len(everywhere) >= 251


def test_a_line_end_hyphen_next_to_a_digit_is_a_hyphen_never_joined() -> None:
    # A black-box probe: `1-⏎2 apples` (a range broken at a line end) accepted "12 apples".
    assert not found_in("1-\n2 apples", "12 apples")
    assert found_in("1-\n2 apples", "1-2 apples")
    assert found_in("1-\n2 apples", "1- 2 apples")
    assert found_in("1\u2010\n2 apples", "1\u20102 apples")
    assert not found_in("10-\n20 mg", "1020 mg")
    assert found_in("10-\n20 mg", "10-20 mg")
    # A digit on one side is enough; two letters still join.
    assert not found_in("COVID-\n19 cases", "COVID19 cases")
    assert found_in("COVID-\n19 cases", "COVID-19 cases")
    assert not found_in("page 4-\nb", "page 4b")
    # In one quote with a word's line end, each read its own way.
    passage = "pages 1-\n2 were recei-\nved, pages 3-\n4 were not"
    assert found_in(passage, "pages 1- 2 were received, pages 3-4")
    assert found_in(passage, "pages 1-2 were recei- ved, pages 3- 4")
    assert not found_in(passage, "pages 1-2 were received, pages 34")
    assert not found_in(passage, "pages 12 were recei-ved")


class _CountingSearches:
    """The `re` module as `citations` uses it, counting the pattern searches and the passage
    characters each scans."""

    def __init__(self) -> None:
        self.scanned: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    def search(self, pattern: str, string: str) -> re.Match[str] | None:
        self.scanned.append(len(string))
        return re.search(pattern, string)


def test_the_pattern_search_work_of_one_answer_is_bounded_and_fails_safe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A black-box probe: with a passage of line-end hyphens, a quote reading them in mixed
    # ways costs a pattern search of up to the passage's length times the quote's; an answer
    # may hold hundreds of distinct ones.
    passage = "ab-\n" * 1000  # folded: 3,000 characters
    rng = random.Random(4)
    units = ["abab", "ab-ab", "ab- ab"] * 30
    bodies = {"".join(rng.sample(units, len(units))) for _ in range(300)}  # in the passage
    assert len(bodies) == 300 and {len(body) for body in bodies} == {450}
    made_up = [body + "a-b" for body in bodies]  # not: it fails only at its end
    faithful = "ab-ababab- ab-ab-ab"  # mixed readings, in the passage
    uniform = "ab-ab-ab-ab"  # one reading: found without a pattern search
    late = "".join(rng.sample(units, len(units)))  # as `bodies`, after the budget is spent
    assert late not in bodies
    quotes = [faithful, *made_up, faithful, uniform, late]
    answer = " ".join(f'"{quote}" [source:pdf-1]' for quote in quotes)
    counter = _CountingSearches()
    monkeypatch.setattr(citations, "re", counter)
    report = check_citations(answer, pdf_evidence(passage), CitationPolicy(quotes=False))

    (cited,) = report.cited
    assert [check.found for check in cited.quotes] == [True, *[False] * 300, True, True, False]
    # The work as the budget counts it (quote length times the passage's folded length, plus
    # compiling the pattern) is bounded: the probe's answer searched every quote. A verdict
    # once found is kept.
    assert set(counter.scanned) == {3000}
    searched = len(counter.scanned) - 1  # the made-up quotes searched, besides `faithful`
    per_character = 3000 + citations._COMPILE_WORK
    assert 0 < searched < 100
    assert (searched * 453 + len(faithful)) * per_character <= citations._PATTERN_BUDGET

    # With `quotes`, distinct faithful quotes each need a search: past the budget one is not
    # found, never accepted unsearched, and the check says why.
    answer = " ".join(f'"{body}" [source:pdf-1]' for body in bodies)
    before = len(counter.scanned)
    with pytest.raises(RetrievalError, match=r"budget .* is spent") as excinfo:
        check_citations(answer, pdf_evidence(passage), CHECK)
    assert excinfo.value.reason == "quote-not-in-passage"
    assert 0 < len(counter.scanned) - before <= citations._PATTERN_BUDGET // (450 * per_character)


@pytest.mark.parametrize("opener", ["“", "«", '"'])
def test_a_long_run_of_unclosed_quote_marks_is_checked_in_linear_time(opener: str) -> None:
    """Probe S: 60,000 `“` without a `”` before a marker froze a host for 64 s (the quote's
    text could hold its own opener, so it was matched from each mark to the line's end). On a
    thread with a bound far above the linear time (0.04 s for 200,000 marks) and far below the
    quadratic one (minutes)."""
    text = opener * 100_000 + " [source:battery-1]"
    done: list[CitationReport] = []
    checker = threading.Thread(
        target=lambda: done.append(check_citations(text, EVIDENCE, CitationPolicy())),
        daemon=True,
    )
    checker.start()
    checker.join(timeout=30)
    assert done, "the check did not finish within 30 s"
    assert [cited.id for cited in done[0].cited] == ["battery-1"]


def test_a_quote_runs_to_the_next_closing_mark_so_invented_outer_text_fails() -> None:
    """Review V: `“X “Y””` checked only `Y` for a while, so invented text around a real
    fragment passed; a quote runs from its opener to the next closer, openers included."""
    policy = CitationPolicy(quotes=True)
    nested = "“it lasts forever “1,200 charge cycles”” [source:battery-1]"
    with pytest.raises(RetrievalError) as invented:
        check_citations(nested, EVIDENCE, policy)
    assert invented.value.reason == "quote-not-in-passage"
    report = check_citations(
        "«measured «battery lifetime» [source:battery-1]", EVIDENCE, citations.MARKERS_ONLY
    )
    assert [check.text for check in report.cited[0].quotes] == ["measured «battery lifetime"]
    assert not report.cited[0].quotes[0].found


@pytest.mark.parametrize("seed", range(3))
def test_quotes_are_found_as_the_regular_expression_finds_them(seed: int) -> None:
    """The scan gives what `finditer` of the expression it replaced gives, in linear time."""
    expression = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|«([^»\n]+)»')
    rng = random.Random(seed)
    for _ in range(3_000):
        text = "".join(rng.choice('ab "“”«»\n') for _ in range(rng.randint(0, 30)))
        expected = [
            (m.start(), next(g for g in m.groups() if g is not None))
            for m in expression.finditer(text)
        ]
        assert list(citations._quotes(text)) == expected, text

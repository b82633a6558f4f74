"""The host's check of a run's answer (`RunRequest.citations`), before the run completes.

Markers are read as the client's `validate_source_citations` reads them: any `[source:` (any
case) opens one, and only `[source:ID]` with a non-empty id free of whitespace and brackets is
well formed. Each well-formed id must name a passage of the run's evidence (its manifest), which
was re-authorized at its current revision just before. With `require`, the answer must cite at
least once.

Quotes: text in double quotation marks (`"…"`, `“…”`, `«…»`) that stands *next to* a marker (in
the stretch since the previous marker or the start of the line) is the answer's claim of what
that passage says: it must occur in the passage, compared as they are (case included) after
folding what differs only in how text was encoded, on both sides alike:
- white space: every run of it is one space;
- compatibility forms, by NFKC (as the lexical analyzer folds them): a PDF's ligature glyph
  `ﬁ` (U+FB01) is `fi`, a full-width letter its ASCII one, a decomposed accent the composed
  letter, `…` is `...`. Superscript and subscript characters (those Unicode decomposes as
  `<super>` or `<sub>`: `²`, `⁶`, `₂`, `ⁿ`, `™`) are kept as they are, never read as the plain
  digit or letter: `10⁶` is not `106`, so a quote must write `10⁶` (and `H₂O`, not `H2O`);
- a soft hyphen (U+00AD), which no reader sees, is removed;
- a hyphen (`-`, U+2010 or a soft hyphen) that ends a line between two letters (spaces
  around the line break allowed) is a word hyphenated at a line end, as PDF text has them:
  the quote may read it hyphenated (`recei-ved`, `recei- ved`, with `-` or U+2010) or joined
  (`received`), each such line end in its own way (`well-known` and `received` in one quote).
  Between word characters not both letters (a digit on either side: `1-⏎2`, `COVID-⏎19`) it
  is a hyphen the text has (a range, a code): the quote may read it `1-2` or `1- 2`, never
  joined (`12`). Quotes hold no line break, so only a passage has such hyphens.
A quote that differs from the passage in anything else (a letter, a digit, punctuation, a
hyphen mid-line, case) is not found. Every such quote is reported per cited passage; with
`quotes`, one not found fails the check.

Work: a quote is looked for in each uniform reading of the passage's line-end hyphens (every
one joined, every one hyphenated, …), which costs about the passage's length. Only a quote that
reads them in different ways needs a pattern search, costing up to the passage's length times
the quote's (and compiling it, the quote's length); one answer may spend `_PATTERN_BUDGET` of
that work in all (about 38 such quotes of 400 characters against passages of 4,000; under half
a second at worst). Beyond it a quote not found by the uniform readings is reported not found
(with `quotes`, the check fails, its detail saying the budget was spent): the check fails safe,
never accepting a quote it did not find, and an answer of many made-up quotes costs bounded
time.

What this cannot tell: whether the passage supports the sentence, and anything about text
outside quotation marks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Final

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.evidence import defang
from retrieval_host.core.reasons import InvalidCitationReason
from retrieval_host.core.run_ports import EvidencePassage
from retrieval_host.core.runs_model import (
    CitationPolicy,
    CitationReport,
    CitedSource,
    QuoteCheck,
)

__all__ = ["MARKERS_ONLY", "check_citations"]

# The check every answer gets when its run asked for none: its markers well formed and naming
# passages of the manifest, no citation required, quotes not checked.
MARKERS_ONLY: Final = CitationPolicy(require=False, quotes=False)

# The client's rule (`retrieval_host_client._citations`): any `[source:`, in any case and with
# spaces around `source`, opens a marker; one that is not `[source:ID]` is malformed.
_OPEN: Final = re.compile(r"\[\s*source\s*:", re.IGNORECASE)
_WELL_FORMED: Final = re.compile(r"\[source:([^\[\]\s]+)\]")
# A quote runs from its opening mark to the next closing mark on its line (openers inside it
# are its text: of `“X “Y”` all of `X “Y` must be in the passage). Found by a scan, not the
# regular expression `“([^”\n]+)”`, which was tried from each of a run of unclosed `“` to the
# line's end: quadratic under the interpreter lock (60,000 froze a host for 64 s; probe S).
_QUOTE_MARKS: Final = {'"': '"', "“": "”", "«": "»"}
# A hyphen at a line end between word characters, where a PDF's text breaks a word or a range.
# In a folded passage each becomes `_BREAK` (between two letters: the word joined or
# hyphenated) or `_KEPT_HYPHEN` (else: hyphenated only), characters folding first removes from
# both sides (text never needs a NUL or a U+0001), so a quote can be matched against each
# reading.
_LINE_END_HYPHEN: Final = re.compile(r"(?<=\w)[-\u2010\u00ad][^\S\n]*\n[^\S\n]*(?=\w)")
_BREAK: Final = "\x00"
_KEPT_HYPHEN: Final = "\x01"
_SOFT_HYPHEN: Final = "\u00ad"
_HYPHENS: Final = frozenset("-\u2010")
# What a quote's text reads as at a `_BREAK` besides nothing, and at a `_KEPT_HYPHEN`; each
# such reading, and every other hyphen with the space after it, is removed to give a text's
# hyphen-free form.
_HYPHEN_READING: Final = re.compile("[-\u2010] ?")
# The uniform readings, (`_BREAK`, `_KEPT_HYPHEN`) each: together they find any quote that
# crosses at most one line-end hyphen, or reads all of them alike.
_UNIFORM_READINGS: Final = (("", "-"), ("-", "-"), ("- ", "- "))
# The blocks that hold every character Unicode decomposes as `<super>` or `<sub>` (a test
# checks that no other code point is one): NFKC would read `⁶` as `6`, so runs of them are left
# out of it. Built once, from these blocks only (a scan of all of Unicode takes 0.1 s).
_SUPER_SUB_BLOCKS: Final = (
    (0x00A0, 0x00FF),  # Latin-1: ª ² ³ ¹ º
    (0x02B0, 0x02FF),  # spacing modifier letters
    (0x10A0, 0x10FF),  # Georgian
    (0x1D00, 0x1DBF),  # phonetic extensions
    (0x2070, 0x209F),  # superscripts and subscripts
    (0x2100, 0x214F),  # letterlike symbols: ℠ ™
    (0x2C60, 0x2C7F),  # Latin extended-C
    (0x2D30, 0x2D7F),  # Tifinagh
    (0x3190, 0x319F),  # Kanbun
    (0xA640, 0xA69F),  # Cyrillic extended-B
    (0xA700, 0xA7FF),  # Latin extended-D
    (0xAB30, 0xAB6F),  # Latin extended-E
    (0x10780, 0x107BF),  # Latin extended-F
    (0x1E030, 0x1E08F),  # Cyrillic extended-D
    (0x1F100, 0x1F1FF),  # enclosed alphanumeric supplement: 🅪 🅫 🅬
)
_SUPER_SUB: Final = frozenset(
    chr(code)
    for first, last in _SUPER_SUB_BLOCKS
    for code in range(first, last + 1)
    if unicodedata.decomposition(chr(code)).startswith(("<super>", "<sub>"))
)


def _ranges(characters: frozenset[str]) -> str:
    """A character class's body for `characters`, each run of consecutive code points as a
    range (which `re` matches faster than a long list)."""
    codes = {ord(character) for character in characters}
    body = []
    for start in sorted(code for code in codes if code - 1 not in codes):
        end = start
        while end + 1 in codes:
            end += 1
        body.append(re.escape(chr(start)) + ("" if end == start else f"-{re.escape(chr(end))}"))
    return "".join(body)


_SUPER_SUB_RUN: Final = re.compile(f"([{_ranges(_SUPER_SUB)}]+)")
# Pattern-search work one answer may spend (module docstring), in quote characters times
# passage characters scanned, compiling a quote's pattern counted as scanning
# `_COMPILE_WORK` more (it costs about 7 µs per quote character, a scan 3 ns per pair): under
# half a second at worst; 38 quotes of 400 characters that each read the line ends of a
# passage of 4,000 characters in mixed ways.
_PATTERN_BUDGET: Final = 100_000_000
_COMPILE_WORK: Final = 2_500


def _quotes(text: str) -> Iterator[tuple[int, str]]:
    """(position, text) of each quote in `text`, in order, as the expression
    `"([^"\n]+)"|“([^”\n]+)”|«([^»\n]+)»` finds them, in linear time: an opener whose closing
    mark is not on its line is remembered as such until the line's end, so no later opener of
    its kind on that line is searched from again."""
    hopeless: dict[str, int] = {}  # opener -> the line end before which it cannot close
    i, end, line_end = 0, len(text), -1
    while i < end:
        close = _QUOTE_MARKS.get(text[i])
        if close is None or i < hopeless.get(text[i], -1):
            i += 1
            continue
        if line_end < i:
            line_end = text.find("\n", i)
            line_end = end if line_end < 0 else line_end
        j = text.find(close, i + 1, line_end)
        if j < 0:
            hopeless[text[i]] = line_end
            i += 1
        elif j == i + 1:  # an empty quote is none: its closer may open the next
            i += 1
        else:
            yield i, text[i + 1 : j]
            i = j + 1


def check_citations(
    text: str, evidence: Mapping[str, EvidencePassage], policy: CitationPolicy
) -> CitationReport:
    """The report of a passing answer; `INVALID_CITATION` (with its reason) for the first
    problem of a failing one."""
    quotes: dict[str, list[QuoteCheck]] = {}
    folded: dict[str, _FoldedPassage] = {}  # per cited passage, as quotes are compared with it
    budget = _Budget(_PATTERN_BUDGET)
    segment_start = 0
    for opening in _OPEN.finditer(text):
        match = _WELL_FORMED.match(text, opening.start())
        if match is None:
            raise _invalid(
                InvalidCitationReason.MALFORMED_MARKER,
                f"the answer has a malformed citation marker at character {opening.start()}.",
            )
        handle = match.group(1)
        passage = evidence.get(handle)
        if passage is None:
            raise _invalid(
                InvalidCitationReason.UNKNOWN_SOURCE,
                f"the answer cites {handle[:64]!r}, which is not in the run's manifest.",
            )
        # The stretch starts after the previous marker or the last line break, whichever is
        # later; searched back only to the previous marker, so an answer of many markers on
        # one long line costs linear time (a search back to the line's start was quadratic).
        line_break = text.rfind("\n", segment_start, opening.start())
        offset = segment_start if line_break < 0 else line_break + 1
        stretch = text[offset : opening.start()]
        checks = quotes.setdefault(handle, [])
        for start, said in _quotes(stretch):
            if handle not in folded:
                folded[handle] = _FoldedPassage(passage.text)
            verdict = folded[handle].holds(_folded(said), budget)
            if not verdict and policy.quotes:
                # Only positions in the detail: problem bodies carry no generated text.
                where = (
                    f"the quote at character {offset + start} of the answer, next to "
                    f"[source:{handle}],"
                )
                raise _invalid(
                    InvalidCitationReason.QUOTE_NOT_IN_PASSAGE,
                    f"{where} is not in that passage."
                    if verdict is not None
                    else f"{where} is not in that passage as its line-end hyphens read "
                    "uniformly, and the answer's budget for searching mixed readings is spent.",
                )
            checks.append(QuoteCheck(said, verdict is True))
        segment_start = match.end()
    if policy.require and not quotes:
        raise _invalid(
            InvalidCitationReason.NO_CITATION, "the answer cites no passage, but one is required."
        )
    return CitationReport([CitedSource(h, tuple(q)) for h, q in quotes.items()])


def _folded(text: str) -> str:
    """`text` as quotes and passages are compared (module docstring): with every handle marker
    as a model is shown it (`defang`: a passage holding `[source:` reaches the model, and the
    extractive provider's quotes, as `(source:`, so a faithful quote of it must be found),
    NFKC-folded but for superscripts and subscripts, each hyphenated line end turned into
    `_BREAK` or `_KEPT_HYPHEN`, soft hyphens removed and white space normalized."""
    text = _nfkc_but_super_sub(_without_sentinels(defang(text)))
    text = _LINE_END_HYPHEN.sub(_line_end, text).replace(_SOFT_HYPHEN, "")
    return " ".join(text.split())


def _without_sentinels(text: str) -> str:
    """`text` without the characters folding gives line-end hyphens."""
    return text.replace(_BREAK, "").replace(_KEPT_HYPHEN, "")


def _nfkc_but_super_sub(text: str) -> str:
    """`text` NFKC-normalized, each run of superscript and subscript characters kept as it is
    (the pieces between normalized on their own)."""
    if text.isascii() or _SUPER_SUB.isdisjoint(text):
        return unicodedata.normalize("NFKC", text)
    pieces = _SUPER_SUB_RUN.split(text)  # other text at even indices, runs kept at odd ones
    pieces[::2] = [unicodedata.normalize("NFKC", piece) for piece in pieces[::2]]
    return "".join(pieces)


def _line_end(match: re.Match[str]) -> str:
    """What a line-end hyphen between word characters stands for: between two letters, a word
    broken there; else a hyphen the text has (`1-2`, `COVID-19`)."""
    text = match.string
    if text[match.start() - 1].isalpha() and text[match.end()].isalpha():
        return _BREAK
    return _KEPT_HYPHEN


class _Budget:
    """The pattern-search work an answer's check may still spend (module docstring)."""

    def __init__(self, left: int) -> None:
        self.left = left

    def spend(self, work: int) -> bool:
        """Whether `work` is allowed, taking it from what is left if so."""
        if work > self.left:
            return False
        self.left -= work
        return True


class _FoldedPassage:
    """A cited passage's text as quotes are compared with it, and the readings of its
    hyphenated line ends, computed once per answer."""

    def __init__(self, text: str) -> None:
        self.text = _folded(text)
        self.breaks = _BREAK in self.text or _KEPT_HYPHEN in self.text
        self.readings = (
            tuple(
                self.text.replace(_BREAK, joined).replace(_KEPT_HYPHEN, kept)
                for joined, kept in _UNIFORM_READINGS
            )
            if self.breaks
            else ()
        )
        self.hyphen_free = _hyphen_free(self.text) if self.breaks else ""
        self.longest = len(self.readings[-1]) if self.breaks else len(self.text)
        self.verdicts: dict[str, bool] = {}

    def holds(self, quote: str, budget: _Budget) -> bool | None:
        """Whether the folded `quote` is in the passage, each `_BREAK` read as a hyphen, a
        hyphen and a space, or nothing, each `_KEPT_HYPHEN` as one of the first two (module
        docstring); None when only a pattern search could tell and `budget` does not allow
        it."""
        if not self.breaks:
            return quote in self.text
        if any(quote in reading for reading in self.readings):
            return True
        # A quote with no hyphen reads every break it crosses as nothing (and crosses no kept
        # hyphen): the first reading was exact. One whose hyphen-free form the passage's lacks
        # is in no reading at all.
        if not _HYPHENS.intersection(quote) or _hyphen_free(quote) not in self.hyphen_free:
            return False
        # Left: a quote that reads line ends in different ways, or nearly matches. The pattern
        # search costs up to the two lengths' product (and compiling, the quote's length): its
        # verdicts are kept, and what one answer spends on them is bounded.
        if quote not in self.verdicts:
            if len(quote) > self.longest:
                return False  # longer than the passage reads even with every hyphen spaced
            if not budget.spend(len(quote) * (len(self.text) + _COMPILE_WORK)):
                return None
            found = re.search(_break_tolerant(quote), self.text) is not None
            self.verdicts[quote] = found
        return self.verdicts[quote]


def _hyphen_free(text: str) -> str:
    """`text` without line-end hyphens and without hyphens (each with the space after it): a
    quote found in a passage is found in this form of it too, the converse not always."""
    return _HYPHEN_READING.sub("", _without_sentinels(text))


def _break_tolerant(quote: str) -> str:
    """A pattern of `quote` in which a hyphen (with the space after it) may also be a
    passage's `_BREAK` or `_KEPT_HYPHEN`, and a `_BREAK` may stand between two letters (the
    joined word). Nothing is optional but the `_BREAK`s, so it matches only text that reads as
    the quote."""
    pieces: list[str] = []
    previous = ""
    at = 0
    while at < len(quote):
        char = quote[at]
        if char in _HYPHENS:
            written = quote[at : at + 2] if quote.startswith(" ", at + 1) else char
            pieces.append(f"(?:{_BREAK}|{_KEPT_HYPHEN}|{re.escape(written)})")
            at += len(written)
            previous = written[-1]
            continue
        if previous.isalpha() and char.isalpha():
            pieces.append(f"{_BREAK}?")
        pieces.append(re.escape(char))
        previous = char
        at += 1
    return "".join(pieces)


def _invalid(reason: InvalidCitationReason, detail: str) -> RetrievalError:
    return RetrievalError(ErrorCode.INVALID_CITATION, detail, reason=reason)

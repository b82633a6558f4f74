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
  letter. This also reads `²` as `2` and `…` as `...`;
- a soft hyphen (U+00AD), which no reader sees, is removed;
- a hyphen (`-`, U+2010 or a soft hyphen) that ends a line between two word characters
  (spaces around the line break allowed) is a word hyphenated at a line end, as PDF text
  has them: the quote may read it hyphenated (`recei-ved`, `recei- ved`, with `-` or U+2010)
  or joined (`received`), each such line end in its own way (`well-known` and `received` in
  one quote). Quotes hold no line break, so only a passage has such hyphens.
A quote that differs from the passage in anything else (a letter, a digit, punctuation, a
hyphen mid-line, case) is not found. Every such quote is reported per cited passage; with
`quotes`, one not found fails the check.

What this cannot tell: whether the passage supports the sentence, and anything about text
outside quotation marks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
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
_QUOTE: Final = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|«([^»\n]+)»')
# A hyphen at a line end between word characters, where a PDF's text breaks a word. In a folded
# passage each becomes `_BREAK`, a character folding first removes from both sides (text never
# needs a NUL), so a quote can be matched against the joined and the hyphenated reading.
_LINE_END_HYPHEN: Final = re.compile(r"(?<=\w)[-\u2010\u00ad][^\S\n]*\n[^\S\n]*(?=\w)")
_BREAK: Final = "\x00"
_SOFT_HYPHEN: Final = "\u00ad"
_HYPHENS: Final = frozenset("-\u2010")
# What a quote's text reads as at a `_BREAK` besides nothing; each such reading, and every
# other hyphen with the space after it, is removed to give a text's hyphen-free form.
_HYPHEN_READING: Final = re.compile("[-\u2010] ?")
_WORD_CHARACTER: Final = re.compile(r"\w")


def check_citations(
    text: str, evidence: Mapping[str, EvidencePassage], policy: CitationPolicy
) -> CitationReport:
    """The report of a passing answer; `INVALID_CITATION` (with its reason) for the first
    problem of a failing one."""
    quotes: dict[str, list[QuoteCheck]] = {}
    folded: dict[str, _FoldedPassage] = {}  # per cited passage, as quotes are compared with it
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
        for quoted in _QUOTE.finditer(stretch):
            said = next(g for g in quoted.groups() if g is not None)
            if handle not in folded:
                folded[handle] = _FoldedPassage(passage.text)
            found = folded[handle].holds(_folded(said))
            if not found and policy.quotes:
                # Only positions in the detail: problem bodies carry no generated text.
                raise _invalid(
                    InvalidCitationReason.QUOTE_NOT_IN_PASSAGE,
                    f"the quote at character {offset + quoted.start()} of the answer, next to "
                    f"[source:{handle}], is not in that passage.",
                )
            checks.append(QuoteCheck(said, found))
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
    NFKC-folded, each hyphenated line end turned into `_BREAK`, soft hyphens removed and white
    space normalized."""
    text = unicodedata.normalize("NFKC", defang(text).replace(_BREAK, ""))
    text = _LINE_END_HYPHEN.sub(_BREAK, text).replace(_SOFT_HYPHEN, "")
    return " ".join(text.split())


class _FoldedPassage:
    """A cited passage's text as quotes are compared with it, and the readings of its
    hyphenated line ends, computed once per answer."""

    def __init__(self, text: str) -> None:
        self.text = _folded(text)
        self.breaks = _BREAK in self.text
        # Every break read alike: together these find any quote that crosses at most one.
        self.readings = (
            tuple(self.text.replace(_BREAK, r) for r in ("", "-", "- ")) if self.breaks else ()
        )
        self.hyphen_free = _hyphen_free(self.text) if self.breaks else ""
        self.verdicts: dict[str, bool] = {}

    def holds(self, quote: str) -> bool:
        """Whether the folded `quote` is in the passage, each break read as a hyphen, a hyphen
        and a space, or nothing (module docstring)."""
        if not self.breaks:
            return quote in self.text
        if any(quote in reading for reading in self.readings):
            return True
        # A quote with no hyphen reads every break it crosses as nothing: the first reading
        # was exact. One whose hyphen-free form the passage's lacks is in no reading at all.
        if not _HYPHENS.intersection(quote) or _hyphen_free(quote) not in self.hyphen_free:
            return False
        # Left: a quote that reads breaks in different ways, or nearly matches. The pattern
        # search costs up to the two lengths' product, so its verdicts are kept.
        if quote not in self.verdicts:
            found = re.search(_break_tolerant(quote), self.text) is not None
            self.verdicts[quote] = found
        return self.verdicts[quote]


def _hyphen_free(text: str) -> str:
    """`text` without breaks and without hyphens (each with the space after it): a quote
    found in a passage is found in this form of it too, the converse not always."""
    return _HYPHEN_READING.sub("", text.replace(_BREAK, ""))


def _break_tolerant(quote: str) -> str:
    """A pattern of `quote` in which a hyphen (with the space after it) may also be a
    passage's `_BREAK`, and one may stand between two word characters (the joined word).
    Nothing is optional but the `_BREAK`s, so it matches only text that reads as the quote."""
    pieces: list[str] = []
    previous = ""
    at = 0
    while at < len(quote):
        char = quote[at]
        if char in _HYPHENS:
            written = quote[at : at + 2] if quote.startswith(" ", at + 1) else char
            pieces.append(f"(?:{_BREAK}|{re.escape(written)})")
            at += len(written)
            previous = written[-1]
            continue
        if _WORD_CHARACTER.match(previous) and _WORD_CHARACTER.match(char):
            pieces.append(f"{_BREAK}?")
        pieces.append(re.escape(char))
        previous = char
        at += 1
    return "".join(pieces)


def _invalid(reason: InvalidCitationReason, detail: str) -> RetrievalError:
    return RetrievalError(ErrorCode.INVALID_CITATION, detail, reason=reason)

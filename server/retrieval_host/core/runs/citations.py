"""The host's check of a run's answer (`RunRequest.citations`), before the run completes.

Markers are read as the client's `validate_source_citations` reads them: any `[source:` (any
case) opens one, and only `[source:ID]` with a non-empty id free of whitespace and brackets is
well formed. Each well-formed id must name a passage of the run's evidence (its manifest), which
was re-authorized at its current revision just before. With `require`, the answer must cite at
least once.

Quotes: text in double quotation marks (`"…"`, `“…”`, `«…»`) that stands *next to* a marker (in
the stretch since the previous marker or the start of the line) is the answer's claim of what
that passage says: it must occur in the passage, both whitespace-normalized and compared as
they are (case included). Every such quote is reported per cited passage; with `quotes`, one
not found fails the check.

What this cannot tell: whether the passage supports the sentence, and anything about text
outside quotation marks.
"""

from __future__ import annotations

import re
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


def check_citations(
    text: str, evidence: Mapping[str, EvidencePassage], policy: CitationPolicy
) -> CitationReport:
    """The report of a passing answer; `INVALID_CITATION` (with its reason) for the first
    problem of a failing one."""
    quotes: dict[str, list[QuoteCheck]] = {}
    folded: dict[str, str] = {}  # per cited passage, its text as quotes are compared with it
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
                folded[handle] = _folded(passage.text)
            found = _folded(said) in folded[handle]
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
    """Whitespace-normalized, and with every handle marker as a model is shown it (`defang`):
    a passage holding `[source:` reaches the model, and the extractive provider's quotes, as
    `(source:`, so a faithful quote of it must be found."""
    return " ".join(defang(text).split())


def _invalid(reason: InvalidCitationReason, detail: str) -> RetrievalError:
    return RetrievalError(ErrorCode.INVALID_CITATION, detail, reason=reason)

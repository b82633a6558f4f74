"""Quoted text in e-mail: a quote's `>` marks, attributions, and the quotes a thread repeats.

A reply that quotes the message it answers holds that message's text a second time. Indexed,
the copy competes with the original in search (it often ranked above it: a reply adds words
around the same text) and is cited as if the replier had said it. `repeated_quote_lines`
finds the quote a top-posted reply ends with when another message of the same thread says
its text itself, in its own unquoted lines; ingest leaves it, and the attribution that
introduces it ("On Mon, 1 Jan 2024, Ann <ann@example.org> wrote:"), out of the passages. The
original keeps the text, so nothing said in the thread is lost to search: a quote followed by
the reply's own lines (inline or bottom-posted answers, whose questions are their context), a
quote holding a line the thread does not say unquoted (a message not in the file, a short
answer quoted within the quote, a changed word), and a sentence that merely ends in "wrote:"
all stay.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

# The `>` marks that begin a quoted line, each with an optional space: its quote depth.
QUOTE_MARKS: Final = re.compile(r" {0,3}((?:>[ \t]?)+)")
# An attribution: "On Mon, 1 Jan 2024, Ann <ann@example.org> wrote:", "Carol Diaz wrote:".
ATTRIBUTION: Final = re.compile(
    r"(?:on\s.{0,200}|\S(?:[^.!?]|\.(?!\s)){0,100}?)\swrote:", re.IGNORECASE
)
# Up to this many lines an attribution a mail client wrapped may take.
ATTRIBUTION_LINES: Final = 3
# The attributions ingest leaves out with their quote, stricter than `ATTRIBUTION` (which only
# keeps a line out of an extractive answer): a dated or addressed "On ... wrote:" with no
# sentence in it, or a name of at most four words without punctuation ("Carol Diaz wrote:").
# "On the fuel dock: it stays open. For the quay, here is what Ann wrote:" is the reply's own.
_DATED: Final = re.compile(
    r"on\s(?:(?![.!?]\s).){0,200}?(?:@|<|\d{1,2}:\d{2}|\b(?:19|20)\d{2}\b)"
    r"(?:(?![.!?]\s).){0,200}?\swrote:",
    re.IGNORECASE,
)
_NAMED: Final = re.compile(r"[^\s,.;:!?]+(?: [^\s,.;:!?]+){0,3} wrote:", re.IGNORECASE)
# Paragraphs a message's quote is examined in at most (a crafted thread of tiny quoted
# paragraphs must not cost more than its ingest would).
MAX_PARAGRAPHS: Final = 100_000

# Quoted text is matched by runs of this many words (shingles), so that a quote the replier's
# client wrapped anew still matches: each word a CRC-32, each run a 64-bit hash of those (the
# same in every process, and no table of the thread's words in memory).
SHINGLE_WORDS: Final = 8
_MIX: Final = np.uint64(0x9E3779B97F4A7C15)
_Hashes = npt.NDArray[np.uint64]


def is_attribution(lines: Sequence[str]) -> bool:
    """Whether these lines, joined, are an attribution."""
    return ATTRIBUTION.fullmatch(" ".join(line.strip() for line in lines)) is not None


def is_dropped_attribution(lines: Sequence[str]) -> bool:
    """Whether these lines, joined, are an attribution ingest leaves out with its quote."""
    text = " ".join(line.strip() for line in lines)
    return _DATED.fullmatch(text) is not None or _NAMED.fullmatch(text) is not None


def repeated_quote_lines(bodies: Sequence[Sequence[str]]) -> list[frozenset[int]]:
    """For each message body (its lines), the indices of the lines to leave out: the quoted
    paragraphs (blank-line separated) a body ends with, each of whose runs of quoted words at
    one depth the thread's unquoted lines hold (a run of fewer than `SHINGLE_WORDS` words, too
    short to tell, must be an attribution), with the attributions opening or preceding them.
    Nothing for a lone message: no other message can hold its quotes."""
    if len(bodies) < 2:
        return [frozenset() for _ in bodies]
    own = [_shingles(_unquoted_words(lines)) for lines in bodies]
    said = np.sort(np.concatenate(own))
    budget = [MAX_PARAGRAPHS]
    return [frozenset(_trailing_quote(lines, said, budget)) for lines in bodies]


def _unquoted_words(lines: Sequence[str]) -> Iterator[str]:
    return (word for line in lines if not QUOTE_MARKS.match(line) for word in line.split())


def _trailing_quote(lines: Sequence[str], said: _Hashes, budget: list[int]) -> Iterator[int]:
    """The lines of the quote the body ends with, from its last paragraph back, while each
    repeats the thread (an attribution paragraph just before one that does goes too)."""
    dropped = False
    for start, end in reversed(list(paragraph_spans(lines))):
        budget[0] -= 1
        if budget[0] < 0 or len(said) == 0:
            return
        block = lines[start:end]
        if _repeats(block, said):
            dropped = True
        elif not (
            dropped
            and end - start <= ATTRIBUTION_LINES
            and not any(QUOTE_MARKS.match(line) for line in block)
            and is_dropped_attribution(block)
        ):
            return  # the reply's own text: what comes before it stays
        yield from range(start, end)


def _repeats(block: Sequence[str], said: _Hashes) -> bool:
    marks = [QUOTE_MARKS.match(line) for line in block]
    opening = next((i for i, mark in enumerate(marks) if mark is not None), len(block))
    if opening == len(block) or opening > ATTRIBUTION_LINES:
        return False
    if opening and not is_dropped_attribution(block[:opening]):
        return False
    runs: list[list[str]] = []
    depth = 0
    for line, mark in zip(block[opening:], marks[opening:], strict=True):
        if mark is None:
            return False  # a line of the reply's own among the quote: an inline answer
        level = mark.group(1).count(">")
        if level != depth:
            runs.append([])
            depth = level
        runs[-1].extend(line[mark.end() :].split())
    found = False
    for words in runs:
        if not words:
            continue  # `>` lines that only separate
        if len(words) < SHINGLE_WORDS:
            # Too short to match: only an attribution of a quote within the quote may go
            # (a short answer quoted here may be said nowhere else).
            if not is_dropped_attribution([" ".join(words)]):
                return False
            continue
        if not _all_in(_shingles(iter(words)), said):
            return False
        found = True
    return found


def _all_in(shingles: _Hashes, said: _Hashes) -> bool:
    """Whether every shingle is in `said` (sorted, not empty)."""
    at = np.searchsorted(said, shingles).clip(max=len(said) - 1)
    return bool((said[at] == shingles).all())


def _shingles(words: Iterator[str]) -> _Hashes:
    """The hash of each run of `SHINGLE_WORDS` words (none when there are fewer)."""
    each = np.fromiter((zlib.crc32(word.encode()) for word in words), np.uint64)
    count = len(each) - SHINGLE_WORDS + 1
    if count <= 0:
        return np.zeros(0, np.uint64)
    shingles = np.zeros(count, np.uint64)
    for k in range(SHINGLE_WORDS):
        shingles = shingles * _MIX + each[k : k + count]  # wraps around, as intended
    return shingles


def paragraph_spans(lines: Sequence[str]) -> Iterator[tuple[int, int]]:
    """`(start, end)` line indices of each run of non-blank lines (a paragraph), in order; the
    chunker's paragraph blocks are these spans too (`ingest/chunking.py`)."""
    start: int | None = None
    for i, line in enumerate(lines):
        if line.strip():
            if start is None:
                start = i
        elif start is not None:
            yield start, i
            start = None
    if start is not None:
        yield start, len(lines)

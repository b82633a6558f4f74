"""Quoted text in e-mail: a quote's `>` marks, attributions, and the quotes a thread repeats.

A reply that quotes the message it answers holds that message's text a second time. Indexed,
the copy competes with the original in search (it often ranked above it: a reply adds words
around the same text) and is cited as if the replier had said it. `repeated_quote_lines`
finds the quoted paragraphs whose text another message of the same thread says itself, in
its own unquoted lines; ingest leaves them, and the attribution that introduces them ("On
Monday, Ann wrote:"), out of the passages. The original keeps the text, so nothing said in
the thread is lost to search; quotes of text the thread does not hold (a message not in the
file, a line changed in the quote) stay.
"""

from __future__ import annotations

import hashlib
import re
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

# Quoted text is matched by runs of this many words (shingles), so that a quote the replier's
# client wrapped anew still matches, each a 64-bit hash (the same in every process).
SHINGLE_WORDS: Final = 8
_MIX: Final = np.uint64(0x9E3779B97F4A7C15)
_Hashes = npt.NDArray[np.uint64]


def is_attribution(lines: Sequence[str]) -> bool:
    """Whether these lines, joined, are an attribution."""
    return ATTRIBUTION.fullmatch(" ".join(line.strip() for line in lines)) is not None


def repeated_quote_lines(bodies: Sequence[Sequence[str]]) -> list[frozenset[int]]:
    """For each message body (its lines), the indices of the lines to leave out: each quoted
    paragraph (blank-line separated; every line quoted, but for an attribution opening it)
    whose quoted text other lines of the thread say unquoted, and an attribution standing
    alone right before such a paragraph. A paragraph must hold at least one run of
    `SHINGLE_WORDS` words at one depth that is found; shorter runs beside it go with it."""
    hashes: dict[str, int] = {}
    own = [_shingles(_unquoted_words(lines), hashes) for lines in bodies]
    said = np.sort(np.concatenate(own)) if own else np.zeros(0, np.uint64)
    return [frozenset(_repeated(lines, said, hashes)) for lines in bodies]


def _unquoted_words(lines: Sequence[str]) -> list[str]:
    return [word for line in lines if not QUOTE_MARKS.match(line) for word in line.split()]


def _repeated(lines: Sequence[str], said: _Hashes, hashes: dict[str, int]) -> Iterator[int]:
    attribution: range | None = None  # an attribution paragraph just before
    for start, end in _paragraphs(lines):
        if _repeats(lines[start:end], said, hashes):
            if attribution is not None and attribution.stop <= start:
                yield from attribution
            yield from range(start, end)
            attribution = None
        elif (
            end - start <= ATTRIBUTION_LINES
            and not any(QUOTE_MARKS.match(line) for line in lines[start:end])
            and is_attribution(lines[start:end])
        ):
            attribution = range(start, end)
        else:
            attribution = None


def _repeats(block: Sequence[str], said: _Hashes, hashes: dict[str, int]) -> bool:
    marks = [QUOTE_MARKS.match(line) for line in block]
    opening = next((i for i, mark in enumerate(marks) if mark is not None), len(block))
    if opening == len(block) or opening > ATTRIBUTION_LINES:
        return False
    if opening and not is_attribution(block[:opening]):
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
        shingles = _shingles(words, hashes)
        if not len(shingles):
            continue  # too short to tell: it goes with the paragraph's other runs
        if not len(said) or not _all_in(shingles, said):
            return False
        found = True
    return found


def _all_in(shingles: _Hashes, said: _Hashes) -> bool:
    """Whether every shingle is in `said` (sorted, not empty)."""
    at = np.searchsorted(said, shingles).clip(max=len(said) - 1)
    return bool((said[at] == shingles).all())


def _shingles(words: Sequence[str], hashes: dict[str, int]) -> _Hashes:
    """The hash of each run of `SHINGLE_WORDS` words (none when there are fewer)."""
    count = len(words) - SHINGLE_WORDS + 1
    if count <= 0:
        return np.zeros(0, np.uint64)
    for word in words:
        if word not in hashes:
            digest = hashlib.blake2b(word.encode(errors="replace"), digest_size=8).digest()
            hashes[word] = int.from_bytes(digest, "little")
    each = np.fromiter((hashes[word] for word in words), np.uint64, len(words))
    shingles = np.zeros(count, np.uint64)
    for k in range(SHINGLE_WORDS):
        shingles = shingles * _MIX + each[k : k + count]  # wraps around, as intended
    return shingles


def _paragraphs(lines: Sequence[str]) -> Iterator[tuple[int, int]]:
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

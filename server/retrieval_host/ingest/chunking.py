"""Cutting extracted text into passages sized by the embedding model's own token count.

The extractors hand over *segments*: runs of numbered lines that share one location context (a
PDF page, a Markdown section, one e-mail message's body). A passage never crosses a segment, so
its `page`, `documentId` and heading path are single-valued.

Inside a segment, text is cut into *pieces*: sentences of prose lines, whole lines of code (a
piece longer than the budget is split again, at whitespace if it can be, else by characters).
Pieces are packed greedily into passages; a *block* (a paragraph, a fenced code block) stays in
one passage whenever it fits in an empty one. Each passage's text is the exact slice of the
segment from its first piece to its last: no text is added, reordered or rewritten.

A piece ends before trailing whitespace. A prose piece starts at its first non-blank
character, so a passage that starts at an indented prose line (a nested list item, an
indented paragraph) leaves that line's indentation out; a code line (a Markdown fence, an HTML
`<pre>`) is one piece from its first column, so a passage starting inside code keeps it. What
the README promises ("Passage context") is this: a passage occurs in its cited lines joined
by `\\n`, starting in the first and ending in the last; not that it equals them (probe I,
session 42, checked equality: 26 of 152 passages of a deeply nested list differed by their
first line's indentation). Passage texts are not part of the default revision, but they are
part of the stored revision's fingerprint: a change to this rule makes re-ingesting an
unchanged file whose passages it changes a `SOURCE_CONFLICT` (`revision-content-differs`)
unless the revision changes with it.

Token counts of pieces are added up as an estimate (the special tokens counted once), then
every finished passage is counted for real and split again if the estimate was short, so the
guarantee `count_tokens(passage) <= max_tokens` (less the context's room,
`ChunkingSettings.content_tokens`) holds for any tokenizer, not only additive ones.

Besides tokens, a passage is bounded by `MAX_PASSAGE_CHARS` characters (long unknown "words"
cost a single token each but still bytes to store).

Overlap: after a passage is closed, its trailing pieces whose tokens add up to at most
`overlap_tokens` start the next passage of the same segment (whole sentences or lines only).

Markup lines (`Block.markup`: a code fence's opening and closing line, a thematic break, a
setext underline) go into passages with the text around them but never make one: a passage
is kept only if it holds a piece beyond its overlap that is not markup. A long fence cut at 64
tokens left a passage holding only its closing ```, or the overlap again and the ```
(session 43): nothing a reader would cite. The line it drops is in no passage, as a
blank line is in none; every passage still occurs in its cited lines. A document whose
passages this changed (`Chunker.markup_left_out`) gets a new default revision; every other
keeps its passages and its revision (checked on 489 documents and settings: 17 changed, each
with its revision).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.mail_quotes import paragraph_spans
from retrieval_host.core.models import Location, Metadata
from retrieval_host.core.reasons import DocumentTooComplexReason, PayloadTooLargeReason
from retrieval_host.ingest.settings import ChunkingSettings, too_complex, too_large

TokenCounter = Callable[[Sequence[str]], list[int]]

# Tokenizers get slow on very long inputs (and a line can be megabytes without a break); no
# span longer than this is ever sent to the counter.
MAX_SPAN_CHARS: Final = 1000
# A passage never spans more characters than this, whatever its token count: a tokenizer may
# read a very long "word" as one unknown token, and stores bound passage bytes (16 KiB by
# default; 4000 characters are at most 16000 bytes of UTF-8).
MAX_PASSAGE_CHARS: Final = 4000
# Spans are counted in batches of about this many, so a huge segment is never counted whole
# before the passage limit has had a chance to stop it.
COUNT_BATCH: Final = 2048
# One call of the counter reads at most about this many characters, and the cancel token is
# checked between calls: a batch of 2,048 spans can be 2 MB of text, seconds of tokenizing on a
# loaded host, long past an ingest deadline. Counts do not depend on how texts are grouped.
COUNT_SLICE_CHARS: Final = 64 * 1024

_SENTENCE_END: Final = re.compile(r"[.!?]['\"”’)\]]*\s+|[。！？]\s*")
_SPACE: Final = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Block:
    """Lines `start..end-1` (indices into `Segment.lines`) that should stay in one passage."""

    start: int
    end: int
    # Code is split by whole lines only (never into sentences) when it does not fit.
    code: bool = False
    # The block's lines (indices into `Segment.lines`) that are markup with nothing of their
    # own to cite: they never make a passage by themselves (see the module docstring).
    markup: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Segment:
    """Numbered lines that share a location context; passages never cross segments."""

    lines: tuple[str, ...]
    first_line: int  # the 1-based line number of lines[0] in its page, file or message body
    blocks: tuple[Block, ...]
    page: int | None = None
    document_id: str | None = None
    # What the segment is about beyond the document's title: the heading path of a Markdown
    # or HTML section, the subject of an e-mail message (`core.passage_context`).
    path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Extracted:
    """What an extractor found in a document, before cutting."""

    segments: tuple[Segment, ...]
    text: str  # the full normalized text: the basis of `documentSha256`
    title: str
    metadata: Metadata


@dataclass(frozen=True, slots=True)
class Passage:
    text: str
    location: Location
    path: tuple[str, ...] = ()  # its segment's


@dataclass(frozen=True, slots=True)
class _Piece:
    start: int  # offsets into the segment text ("\n".join(lines))
    end: int
    line: int  # index into Segment.lines
    tokens: int  # content tokens (the model's count minus its special tokens)
    markup: bool = False  # on one of `Block.markup`'s lines


def paragraph_blocks(lines: Sequence[str]) -> tuple[Block, ...]:
    """Blocks of consecutive non-blank lines (paragraphs separated by blank lines)."""
    return tuple(Block(start, end) for start, end in paragraph_spans(lines))


class Chunker:
    """Cuts segments into passages for one document; enforces the passage limit as it goes."""

    def __init__(
        self,
        counter: TokenCounter,
        settings: ChunkingSettings,
        *,
        max_passages: int,
        allowance: int | None = None,
        cancel: CancelToken | None = None,
    ) -> None:
        self._count = counter
        self._settings = settings
        self._max_passages = max_passages
        # The passages this input's size pays for (`IngestLimits.passage_allowance`); below
        # `max_passages`, passing it is DOCUMENT_TOO_COMPLEX rather than PAYLOAD_TOO_LARGE.
        self._allowance = max_passages if allowance is None else min(allowance, max_passages)
        self._cancel = cancel
        self._emitted = 0
        # Passages of markup alone an earlier release made and this one leaves out (see the
        # module docstring): `prepare_document` marks the default revision of a document
        # that had some, so that sending it again replaces its source rather than meeting
        # its earlier passages under the same revision (`revision-content-differs`).
        self.markup_left_out = 0
        # What the tokenizer adds to any input ([CLS] and [SEP] for BERT-like models).
        self._specials = counter([""])[0]
        # A corpus with passage context keeps room in each passage for its context line.
        self._budget = settings.content_tokens - self._specials
        if self._budget < 8:
            raise ValueError("max_tokens leaves no room for text after the special tokens")

    def passages(self, segments: Sequence[Segment]) -> list[Passage]:
        """The passages of all segments in order; `PAYLOAD_TOO_LARGE` past `max_passages`,
        `DOCUMENT_TOO_COMPLEX` (`passages-per-byte`) past a smaller `allowance`."""
        out: list[Passage] = []
        for segment in segments:
            if self._cancel is not None:
                self._cancel.check()
            out.extend(self._segment(segment))
            if self._cancel is not None:
                self._cancel.progress()
        return out

    # --- one segment -------------------------------------------------------------------------

    def _segment(self, segment: Segment) -> list[Passage]:
        text = "\n".join(segment.lines)
        offsets: list[int] = []
        at = 0
        for line in segment.lines:
            offsets.append(at)
            at += len(line) + 1
        markup = frozenset(line for block in segment.blocks for line in block.markup)
        groups = self._pack(self._counted_blocks(segment, text, offsets, markup))
        # Re-splitting can leave a half of markup only ([code, ```] as [code] and [```]).
        verified = self._verify(text, groups)
        groups = [g for g in verified if not all(p.markup for p in g)]
        self.markup_left_out += len(verified) - len(groups)
        return [
            Passage(
                text[group[0].start : group[-1].end],
                Location(
                    page=segment.page,
                    start_line=segment.first_line + group[0].line,
                    end_line=segment.first_line + group[-1].line,
                    document_id=segment.document_id,
                ),
                segment.path,
            )
            for group in groups
        ]

    def _counted_blocks(
        self, segment: Segment, text: str, offsets: Sequence[int], markup: frozenset[int]
    ) -> Iterator[tuple[Block, list[_Piece]]]:
        pending: list[tuple[Block, list[tuple[int, int, int]]]] = []
        size = 0
        for block in segment.blocks:
            spans: list[tuple[int, int, int]] = []
            for index in range(block.start, block.end):
                line = segment.lines[index]
                for s, e in _line_spans(line, code=block.code):
                    spans.append((offsets[index] + s, offsets[index] + e, index))
            if not spans:
                continue
            pending.append((block, spans))
            size += len(spans)
            if size >= COUNT_BATCH:
                yield from self._count_pending(text, pending, markup)
                pending, size = [], 0
        if pending:
            yield from self._count_pending(text, pending, markup)

    def _count_pending(
        self,
        text: str,
        pending: list[tuple[Block, list[tuple[int, int, int]]]],
        markup: frozenset[int],
    ) -> Iterator[tuple[Block, list[_Piece]]]:
        if self._cancel is not None:
            self._cancel.check()
        flat = [span for _, spans in pending for span in spans]
        pieces = self._fit(text, flat, markup)
        by_index = iter(pieces)
        for block, spans in pending:
            block_pieces: list[_Piece] = []
            for _ in spans:
                block_pieces.extend(next(by_index))
            yield block, block_pieces

    def _fit(
        self, text: str, spans: list[tuple[int, int, int]], markup: frozenset[int]
    ) -> list[list[_Piece]]:
        """Count each span; split any that exceeds the budget until every piece fits."""
        counts = self._content_tokens([text[s:e] for s, e, _ in spans])
        result: list[list[_Piece]] = []
        for (s, e, line), tokens in zip(spans, counts, strict=True):
            if tokens <= self._budget:
                result.append([_Piece(s, e, line, tokens, line in markup)])
                continue
            # Rare (a sentence longer than a whole passage): split and count level by level.
            todo = [(s, e)]
            done: list[_Piece] = []
            while todo:
                halves = [h for a, b in todo for h in _halve(text, a, b)]
                counted = self._content_tokens([text[a:b] for a, b in halves])
                todo = []
                for (a, b), n in zip(halves, counted, strict=True):
                    if n <= self._budget or b - a <= 1:
                        done.append(_Piece(a, b, line, n, line in markup))
                    else:
                        todo.append((a, b))
            done.sort(key=lambda p: p.start)
            result.append(done)
        return result

    def _content_tokens(self, texts: Sequence[str]) -> list[int]:
        return [max(0, n - self._specials) for n in self._count_sliced(texts)]

    def _count_sliced(self, texts: Sequence[str]) -> list[int]:
        """The counter's counts of `texts`, counted `COUNT_SLICE_CHARS` at a time with the
        cancel token checked before each call."""
        counts: list[int] = []
        start = 0
        while start < len(texts):
            if self._cancel is not None:
                self._cancel.check()
            stop, size = start + 1, len(texts[start])
            while stop < len(texts) and size + len(texts[stop]) <= COUNT_SLICE_CHARS:
                size += len(texts[stop])
                stop += 1
            counts += self._count(texts[start:stop])
            start = stop
        return counts

    def _pack(self, blocks: Iterator[tuple[Block, list[_Piece]]]) -> list[list[_Piece]]:
        budget = self._budget
        groups: list[list[_Piece]] = []
        current: list[_Piece] = []
        # Does `current` hold anything beyond the overlap? Markup does not count: a passage of
        # the overlap and a closing fence is not made (see the module docstring).
        fresh = False
        marked = False  # ... or markup beyond the overlap, which made a passage before

        def fits(tokens: int, start: int, end: int) -> bool:
            """Would text `start..end` worth `tokens` fit after `current`?"""
            first = current[0].start if current else start
            return _tokens(current) + tokens <= budget and end - first <= MAX_PASSAGE_CHARS

        def close() -> None:
            nonlocal current, fresh, marked
            if fresh:
                groups.append(current)
                self._count_passage()
                current = self._overlap(current)
                fresh = marked = False
            elif marked:
                self.markup_left_out += 1
                marked = False

        def make_room(tokens: int, start: int, end: int) -> None:
            # Overlap gives way to new text: drop it from the front until the new text fits.
            while current and not fits(tokens, start, end):
                current.pop(0)

        for _, pieces in blocks:
            tokens, start, end = _tokens(pieces), pieces[0].start, pieces[-1].end
            content = not all(p.markup for p in pieces)
            if fits(tokens, start, end):
                current = current + pieces
                fresh, marked = fresh or content, True
                continue
            if tokens <= budget and end - start <= MAX_PASSAGE_CHARS:
                close()
                make_room(tokens, start, end)
                current = current + pieces
                fresh, marked = fresh or content, True
                continue
            for piece in pieces:
                if not fits(piece.tokens, piece.start, piece.end):
                    close()
                    make_room(piece.tokens, piece.start, piece.end)
                current = [*current, piece]
                fresh, marked = fresh or not piece.markup, True
        if fresh:
            groups.append(current)
            self._count_passage()
        elif marked:
            self.markup_left_out += 1
        return groups

    def _overlap(self, group: list[_Piece]) -> list[_Piece]:
        want = self._settings.overlap_tokens
        # The same share of the character bound as of the token budget, so text that is cheap
        # in tokens (long unknown words) cannot make every passage mostly repetition.
        max_chars = MAX_PASSAGE_CHARS * want // self._settings.max_tokens
        taken: list[_Piece] = []
        total = 0
        for piece in reversed(group[1:]):  # never the whole passage again
            if total + piece.tokens > want or group[-1].end - piece.start > max_chars:
                break
            taken.insert(0, piece)
            total += piece.tokens
        return taken

    def _verify(self, text: str, groups: list[list[_Piece]]) -> list[list[_Piece]]:
        """Count each passage for real; re-split those the estimate let grow too long."""
        limit = self._settings.content_tokens
        while True:
            counts = self._count_sliced([text[g[0].start : g[-1].end] for g in groups])
            if all(n <= limit for n in counts):
                return groups
            fixed: list[list[_Piece]] = []
            for group, n in zip(groups, counts, strict=True):
                if n <= limit:
                    fixed.append(group)
                elif len(group) > 1:
                    half = len(group) // 2
                    fixed += [group[:half], group[half:]]
                    self._count_passage()
                else:
                    piece = group[0]
                    if piece.end - piece.start <= 1:
                        raise ValueError("a single character exceeds the token budget")
                    mid = (piece.start + piece.end) // 2
                    fixed += [
                        [_Piece(piece.start, mid, piece.line, piece.tokens // 2, piece.markup)],
                        [_Piece(mid, piece.end, piece.line, piece.tokens // 2, piece.markup)],
                    ]
                    self._count_passage()
            groups = fixed

    def _count_passage(self) -> None:
        self._emitted += 1
        if self._allowance < self._max_passages and self._emitted > self._allowance:
            raise too_complex(
                DocumentTooComplexReason.PASSAGES_PER_BYTE,
                f"the document makes more than {self._allowance} passages for its size.",
            )
        if self._emitted > self._max_passages:
            raise too_large(
                PayloadTooLargeReason.PASSAGES,
                f"the document makes more than {self._max_passages} passages.",
            )


def _tokens(pieces: Sequence[_Piece]) -> int:
    return sum(p.tokens for p in pieces)


def _line_spans(line: str, *, code: bool) -> list[tuple[int, int]]:
    """Non-blank spans of one line: the whole line for code, sentences for prose."""
    if not line.strip():
        return []
    if code:
        spans = [(0, len(line.rstrip()))]
    else:
        spans = []
        start = 0
        for match in _SENTENCE_END.finditer(line):
            spans.append((start, match.end()))
            start = match.end()
        spans.append((start, len(line)))
        spans = [_strip(line, s, e) for s, e in spans]
        spans = [(s, e) for s, e in spans if e > s]
    out: list[tuple[int, int]] = []
    for s, e in spans:
        while e - s > MAX_SPAN_CHARS:
            cut = _cut_point(line, s, s + MAX_SPAN_CHARS)
            out.append(_strip(line, s, cut))
            s = cut
            while s < e and line[s].isspace():
                s += 1
        if e > s:
            out.append((s, e))
    return out


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut_point(text: str, start: int, end: int) -> int:
    """Where to cut text[start:end]: the last whitespace in its second half, else `end`."""
    half = start + (end - start) // 2
    for match in reversed(list(_SPACE.finditer(text, half, end))):
        return match.start() if match.start() > start else end
    return end


def _halve(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split a span near its middle: at whitespace if there is any, else between characters."""
    chunk = text[start:end]
    middle = len(chunk) // 2
    best: int | None = None
    for match in _SPACE.finditer(chunk):
        if match.start() > 0 and (best is None or abs(match.start() - middle) < abs(best - middle)):
            best = match.start()
    if best is None:
        cut_left = cut_right = middle
    else:
        cut_left = best
        cut_right = best
        while cut_right < len(chunk) and chunk[cut_right].isspace():
            cut_right += 1
    left = (start, start + cut_left)
    right = (start + cut_right, end)
    return [span for span in (left, right) if span[1] > span[0]]

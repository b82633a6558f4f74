"""Markdown: heading-aware sections, whole code fences, front matter as metadata.

Markdown must be UTF-8 (a leading BOM is dropped). Guessing another encoding would silently
change the text, and with it the revision, so undecodable bytes are refused with
`INVALID_DOCUMENT` / `markdown-not-utf8`; NUL bytes or a PDF header mean the file is not text at all
(`content-type-mismatch`).

Every heading (ATX `#` or setext underline) starts a section; passages never cross sections,
so each passage has one heading path. A heading with no text of its own before a deeper heading
joins that subsection (no passage holds only a title). Line numbers are the file's, front
matter included, counted after CRLF/CR become LF.

The heading paths are kept in source metadata as `sections`: a list of
`{"headings": [...], "startLine": a, "endLine": b}` in file order (a passage belongs to the
section whose range holds its `startLine`); a list rather than a per-chunk map because it is
smaller and serves any location. If it would not fit the metadata budget it is cut short and
`sectionsTruncated` is true. Front matter (`---` ... `---` or `...` at the very top, shaped as a
YAML mapping: a `key:` line first, then only such lines, comments, list items and indented
lines, every key a name without spaces or a quoted one: `_FRONT_KEY`) is read into
`frontMatter` as strings, with no YAML evaluation. Every key that shape admits is kept (up
to 64 keys and 3,000 bytes), as written but for its quotes (`og:image`, `$schema`, `my key`),
at most 300 characters; a top-level key's value is the text after its colon, and a nested value (the
indented lines under the key, or after a bare `key:` its `- ` items) is kept as its text,
dedented as a block, lines joined by `\\n` (`_nested_value`). Front matter is not part of any
passage; a leading `---` block of any other shape is a thematic break and its text
is indexed. A setext underline (`---`,
`===`) makes a heading only of a paragraph: after a list item, a block quote or a table it is
a thematic break (CommonMark; GitHub's tables). Lines inside an HTML block (`_HTML_STARTS`) or
an indented code block are never headings; passages are cut around them as around any text.
A fence's opening and closing lines, a thematic break and a setext underline are markup
(`Block.markup`): they go into passages with the text around them, never into one of their
own (a fence cut at 64 tokens left a passage of its closing ``` alone, session 43).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Final

from retrieval_host.core.models import JSONValue
from retrieval_host.core.reasons import InvalidDocumentReason
from retrieval_host.core.validation import json_bytes
from retrieval_host.ingest._text import (
    FIELD_CHARS,
    UTF16_BOMS,
    bounded,
    clip,
    normalize_text,
)
from retrieval_host.ingest.chunking import Block, Extracted, Segment
from retrieval_host.ingest.settings import MARKDOWN, invalid_document

_FENCE: Final = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX: Final = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT: Final = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# Lines that make the block they are in something other than a paragraph: a list item, a
# block quote, a table row or a table's delimiter row.
_NOT_PARAGRAPH: Final = re.compile(
    r"^ {0,3}(?:[-*+](?:[ \t]|$)|\d{1,9}[.)](?:[ \t]|$)|>|\|)"
    r"|^[ \t]*:?-+:?[ \t]*\|[ \t]*:?-+:?"
)
# A front matter key: YAML's plain key without spaces (`og:image`, `$schema`, `título`) or a
# quoted one (`"my key"`), then `:` and a space or the end ("Do thing 1 carefully: now." is
# prose). The shape test and the reader use this one pattern: the reader's own, narrower one
# (ASCII letters, digits, `_ .-`) passed the block as front matter and then dropped the keys it
# could not read, silently (session 43).
_FRONT_KEY: Final = re.compile(
    r"""^([^\s#\-"'][^\s]*?|"[^"\n]*"|'[^'\n]*')[ \t]*:(?:[ \t]+(.*)|[ \t]*)$"""
)
# A thematic break: three or more of one of `-`, `*`, `_` (spaces between allowed).
_BREAK: Final = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_INTERRUPTS: Final = re.compile(
    r"^ {0,3}(?:[-*+](?:[ \t]|$)|1[.)](?:[ \t]|$)|>|\|)|^[ \t]*:?-+:?[ \t]*\|[ \t]*:?-+:?"
)
_FRONT_MATTER_MAX_LINES: Final = 200
# A YAML block scalar's header (`|`, `>`, `|-`, `>+2`): what follows the key's colon when its
# value is the indented block below it.
_BLOCK_SCALAR: Final = re.compile(r"^[|>](?:[1-9][+-]?|[+-][1-9]?)?$")
# HTML blocks (CommonMark 4.6, the kinds that can interrupt a paragraph), by what ends each: a
# line holding its closing text, or (a block-level tag) the next blank line. What is inside one
# is HTML, never a heading: a `# TODO` heading commented out in `<!-- ... -->` named every later
# section (probe E, session 37).
_HTML_BLOCK_TAGS: Final = (
    "address|article|aside|base|basefont|blockquote|body|caption|center|col|colgroup|dd|"
    "details|dialog|dir|div|dl|dt|fieldset|figcaption|figure|footer|form|frame|frameset|"
    "h[1-6]|head|header|hr|html|iframe|legend|li|link|main|menu|menuitem|nav|noframes|ol|"
    "optgroup|option|p|param|search|section|summary|table|tbody|td|tfoot|th|thead|title|tr|"
    "track|ul"
)
_HTML_STARTS: Final = (
    (
        re.compile(r"^ {0,3}<(?:pre|script|style|textarea)(?:[ \t>]|$)", re.I),
        re.compile(r"</(?:pre|script|style|textarea)>", re.I),
    ),
    (re.compile(r"^ {0,3}<!--"), re.compile(r"-->")),
    (re.compile(r"^ {0,3}<\?"), re.compile(r"\?>")),
    (re.compile(r"^ {0,3}<![A-Za-z]"), re.compile(r">")),
    (re.compile(r"^ {0,3}<!\[CDATA\["), re.compile(r"\]\]>")),
    (re.compile(rf"^ {{0,3}}</?(?:{_HTML_BLOCK_TAGS})(?:[ \t>]|/>|$)", re.I), None),
)
# A line indented as code (4 spaces or a tab) cannot begin a paragraph a setext underline makes
# a heading: with none open it is an indented code block (CommonMark 4.4).
_INDENTED: Final = re.compile(r"^(?: {4}| {0,3}\t)")
_FRONT_MATTER_MAX_KEYS: Final = 64
_FRONT_MATTER_BUDGET: Final = 3000


@dataclass
class _Section:
    path: tuple[str, ...]
    level: int  # 0 for the text before the first heading
    blocks: list[Block] = field(default_factory=list)
    heading_only: bool = True
    # The level of the path's first heading: an `h1` there names the document, also once a
    # heading-only `# Title` was folded into the `## Section` that follows it.
    top: int = 0


def extract_markdown(data: bytes, title: str | None) -> Extracted:
    """Decode and section a Markdown file (see the module docstring for the rules)."""
    if data.startswith(UTF16_BOMS):
        # Text, in another encoding than the one required: say what to do about it.
        raise invalid_document(
            InvalidDocumentReason.MARKDOWN_NOT_UTF8,
            "Markdown must be UTF-8 (this file is UTF-16); convert the file first.",
        )
    if b"\x00" in data or data.lstrip().startswith(b"%PDF-"):
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH,
            "the bytes are not text, so they are not Markdown.",
        )
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_document(
            InvalidDocumentReason.MARKDOWN_NOT_UTF8,
            "Markdown must be UTF-8; convert the file first.",
        ) from exc
    text = normalize_text(raw.removeprefix("\ufeff"))
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another

    front, body_start = _front_matter(lines)
    sections = _sections(lines, body_start)
    segments: list[Segment] = []
    section_meta: list[dict[str, JSONValue]] = []
    for section in sections:
        if not section.blocks:
            continue
        first, last = section.blocks[0].start, section.blocks[-1].end
        segments.append(
            Segment(
                lines=tuple(lines[first:last]),
                first_line=first + 1,
                blocks=tuple(
                    Block(
                        b.start - first, b.end - first, b.code, tuple(m - first for m in b.markup)
                    )
                    for b in section.blocks
                ),
                path=tuple(clip(h, 200) for h in section.path),
            )
        )
        section_meta.append(
            {
                "headings": [clip(h, 200) for h in section.path],
                "startLine": first + 1,
                "endLine": last,
            }
        )

    metadata: dict[str, JSONValue] = {"mediaType": MARKDOWN, "lineCount": len(lines)}
    if front:
        metadata["frontMatter"] = front
    kept, truncated = bounded(section_meta)
    metadata["sections"] = kept
    if truncated:
        metadata["sectionsTruncated"] = True

    if title is None:
        fm_title = front.get("title")
        # The first `h1`: `# Pump guide` directly followed by `## Priming` (the commonest
        # shape) was folded into that section and the title came out empty (a black-box test).
        h1 = next((s.path[0] for s in sections if s.top == 1 and s.path), None)
        title = fm_title if isinstance(fm_title, str) else (h1 or "")
    return Extracted(tuple(segments), text, title, metadata)


def _front_matter(lines: list[str]) -> tuple[dict[str, JSONValue], int]:
    """Flat `key: value` pairs of a leading `---` block and the index of the first body line."""
    if not lines or lines[0].rstrip() != "---":
        return {}, 0
    end = None
    for i in range(1, min(len(lines), _FRONT_MATTER_MAX_LINES)):
        if lines[i].rstrip() in ("---", "..."):
            end = i
            break
    if end is None:
        return {}, 0  # an unclosed `---` is a thematic break, not front matter
    if not _looks_like_front_matter(lines[1:end]):
        return {}, 0  # prose between two rules is text, not metadata
    front: dict[str, JSONValue] = {}
    i = 1
    while i < end:
        match = _FRONT_KEY.match(lines[i])
        i += 1
        if match is None:
            continue
        inline = (match.group(2) or "").strip()
        nested = i
        while nested < end and _nested_line(lines[nested], compact_list=not inline):
            nested += 1
        block, i = lines[i:nested], nested
        if len(front) >= _FRONT_MATTER_MAX_KEYS:
            continue
        key = clip(_unquote(match.group(1)), FIELD_CHARS)
        if any(line.strip() for line in block):
            value = _nested_value(inline, block)
        else:
            value = clip(_unquote(inline), FIELD_CHARS)
        if json_bytes({**front, key: value}) > _FRONT_MATTER_BUDGET:
            break
        front[key] = value
    return front, end + 1


def _nested_line(line: str, *, compact_list: bool) -> bool:
    """Whether `line` goes on the value of the key above it: an indented or blank line, or
    (after a key with nothing after its colon) a list item at the key's own column, as YAML
    writes a list under a key (`tags:` then `- alpha`)."""
    return (
        not line.strip()
        or line[:1] in (" ", "\t")
        or (compact_list and (line.startswith("- ") or line.rstrip() == "-"))
    )


def _nested_value(inline: str, block: list[str]) -> str:
    """A key's nested value as its text: the indented block dedented as a whole, each line
    cleaned as a flat value is (`clip`) but keeping its indentation under the block's, lines
    joined by `\\n`, blank lines at either end dropped, bounded at `FIELD_CHARS` as a flat
    value is. What is written after the colon comes first, except a block scalar's indicator
    (`|`, `>-`: syntax, not text). A list under `tags:` was stored as `""` (probe I,
    session 42), though the docstring promised nested values kept as their text."""
    lines = [
        line[: len(line) - len(line.lstrip())] + clip(line)
        for line in textwrap.dedent("\n".join(block)).split("\n")
    ]
    if inline and not _BLOCK_SCALAR.match(inline):
        lines.insert(0, clip(inline))
    value = "\n".join(lines).strip("\n")
    return value if len(value) <= FIELD_CHARS else value[: FIELD_CHARS - 1] + "…"


def _looks_like_front_matter(block: list[str]) -> bool:
    """A YAML mapping's shape: its first entry is a `key:` line, and every other line is one
    too, a comment, a list item or an indented continuation. Anything else (a paragraph, a
    list alone) means the leading `---` was a thematic break."""
    content = [line for line in block if line.strip() and not line.lstrip().startswith("#")]
    if not content or _FRONT_KEY.match(content[0]) is None:
        return False
    return all(
        _FRONT_KEY.match(line) is not None
        or line[:1] in (" ", "\t")
        or line.startswith("- ")
        or line.rstrip() == "-"
        for line in content
    )


def _is_paragraph(block: list[str]) -> bool:
    """Whether lines that precede a setext underline are a paragraph: a list item, a block
    quote or a table before `---` or `===` is no heading (CommonMark, GitHub's tables). The
    first line decides what the block is; a later line only interrupts a paragraph as a
    bullet, an item numbered 1, a quote or a table row can (`2. ` goes on the paragraph)."""
    if not block or _NOT_PARAGRAPH.match(block[0]):
        return False
    return not any(_INTERRUPTS.match(line) for line in block[1:])


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _sections(lines: list[str], start: int) -> list[_Section]:
    sections = [_Section((), 0)]
    stack: list[tuple[int, str]] = []
    paragraph: int | None = None  # first line of the open paragraph
    # The open HTML block's end (`_HTML_STARTS`): a pattern its last line holds, None for a
    # block a blank line ends; `html_open` says whether one is open. It only keeps headings
    # out: blocks and passages are cut as before.
    html_open, html_end = False, None
    html_through = -1  # the last line inside an HTML block so far

    def heading(level: int, text: str, first: int, end: int, markup: tuple[int, ...] = ()) -> None:
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, text.strip()))
        path = tuple(h for _, h in stack)
        sections.append(_Section(path, level, [Block(first, end, markup=markup)], top=stack[0][0]))

    def close_paragraph(end: int) -> None:
        nonlocal paragraph
        if paragraph is not None:
            sections[-1].blocks.append(Block(paragraph, end))
            sections[-1].heading_only = False
            paragraph = None

    i = start
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
            close_paragraph(i)
            marker = fence.group(1)
            closing = re.compile(rf"^ {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
            end = len(lines)  # an unclosed fence runs to the end of the document
            for j in range(i + 1, len(lines)):
                if closing.match(lines[j]):
                    end = j + 1
                    break
            # The fence's own lines are markup, never a passage alone (`Block.markup`); an
            # unclosed fence's last line is code.
            fences = (i, end - 1) if end - 1 > i and closing.match(lines[end - 1]) else (i,)
            sections[-1].blocks.append(Block(i, end, code=True, markup=fences))
            sections[-1].heading_only = False
            i = end
            continue
        if html_open and html_end is None and not line.strip():
            html_open = False
        if not html_open:
            html_open, html_end = _html_block(line)
        inside = html_open
        if inside:
            html_through = i
        if html_open and html_end is not None and html_end.search(line):
            html_open = False  # this line ends it (it may have begun it too)
        atx = None if inside else _ATX.match(line)
        if atx:
            close_paragraph(i)
            heading(len(atx.group(1)), atx.group(2) or "", i, i + 1)
            i += 1
            continue
        if not line.strip():
            close_paragraph(i)
            i += 1
            continue
        setext = None if inside else _SETEXT.match(line)
        # Indented code or an HTML block the open block began with is no part of a heading
        # (CommonMark): the paragraph, if any, starts after it (`    code`, `Foo`, `---` is
        # code, then a heading `Foo`; `<!-- badges -->`, `Title`, `===` a heading `Title`).
        first = paragraph
        while (
            first is not None
            and first < i
            and (first <= html_through or _INDENTED.match(lines[first]))
        ):
            first += 1
        if setext and first is not None and _is_paragraph(lines[first:i]):
            if paragraph is not None and first > paragraph:
                close_paragraph(first)  # the code, a block of its own
            paragraph = None
            text = " ".join(part.strip() for part in lines[first:i])
            heading(1 if setext.group(1)[0] == "=" else 2, text, first, i + 1, (i,))
            i += 1
            continue
        if paragraph is None and _BREAK.match(line):
            # A thematic break with no paragraph open is a block of its own: it never begins
            # a paragraph the next `---` could underline into a heading.
            sections[-1].blocks.append(Block(i, i + 1, markup=(i,)))
            i += 1
            continue
        if paragraph is None:
            paragraph = i
        i += 1
    close_paragraph(len(lines))
    return _merge_title_only(sections)


def _html_block(line: str) -> tuple[bool, re.Pattern[str] | None]:
    """Whether `line` begins an HTML block, and what ends it (`_HTML_STARTS`)."""
    for start, end in _HTML_STARTS:
        if start.match(line):
            return True, end
    return False, None


def _merge_title_only(sections: list[_Section]) -> list[_Section]:
    """Fold a heading with no text of its own into the deeper heading that follows it."""
    merged: list[_Section] = []
    carry: list[Block] = []
    for index, section in enumerate(sections):
        section.blocks[:0] = carry
        carry = []
        following = sections[index + 1] if index + 1 < len(sections) else None
        if (
            section.level > 0
            and section.heading_only
            and following is not None
            and following.level > section.level
        ):
            carry = section.blocks
            continue
        merged.append(section)
    return merged

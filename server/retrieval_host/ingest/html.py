"""HTML: visible text with the source's own line numbers, sectioned by its headings.

A citation of an HTML passage must be checkable against the file itself, so every passage
line is the visible text found on that line of the source (tags, scripts and styles removed,
character references decoded, whitespace collapsed outside `<pre>`), and `startLine`/`endLine`
are the HTML file's lines, counted after CRLF/CR become LF. A passage never holds text of two
sections; text of two sections on one source line (`intro <h2>Next</h2>`) goes to each
section's own copy of that line.

Parsing: the standard library's `html.parser` tokenizer (the backend BeautifulSoup uses here)
is driven directly, as a stream. BeautifulSoup's tree records the line of a tag but not of
its text, which citations need; and a stream holds no tree, so deep nesting costs nothing
and nothing recurses. Start tags are counted as they stream (`IngestLimits.max_html_elements`,
`DOCUMENT_TOO_COMPLEX` / `html-elements`); what the tokenizer still spends superlinear time on
(thousands of unterminated tags) is ended by the parse worker's deadline and CPU limit.

- Dropped: `script`, `style`, `template`, `noscript`, `iframe`, `object`, `svg`, form
  controls' contents (`textarea`, `select`), comments, declarations. `<title>` is the default
  title (else the first `h1`), never passage text. Its content is text only, as HTML reads it
  (RCDATA: references decoded, no tags): `<title><script>x</script>Page</title>` is titled
  `<script>x</script>Page`, never `x`.
- Sections: each `h1`..`h6` starts one; its heading path (like Markdown's) is kept in source
  metadata as `sections` (`{"headings", "startLine", "endLine"}`, bounded, with
  `sectionsTruncated`). A heading with no text of its own before a deeper heading joins that
  subsection.
- Blocks: text of one block element (`p`, `li`, `td`, ...) stays in one passage when it fits;
  `<pre>` keeps its lines and indentation and is split by whole lines only.
- Encoding: a byte-order mark, else a `<meta charset>` (or XML) declaration in the first
  4 KiB (found by BeautifulSoup's `EncodingDetector`; its label read as the HTML standard
  reads it: ASCII and ISO-8859-1 as windows-1252, "gb2312" as GBK, "shift_jis" as
  windows-31j, `charsets.text_codec`), else UTF-8 if the bytes are UTF-8,
  else windows-1252, the HTML standard's fallback. Undecodable bytes become U+FFFD: HTML is
  decoded the way browsers decode it, never refused for its encoding.
"""

from __future__ import annotations

import codecs
import contextlib
import html as html_text
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Final

from bs4.dammit import EncodingDetector

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import JSONValue
from retrieval_host.core.reasons import DocumentTooComplexReason, InvalidDocumentReason
from retrieval_host.ingest._text import bounded, clip, normalize_text
from retrieval_host.ingest.charsets import text_codec
from retrieval_host.ingest.chunking import Block, Extracted, Segment
from retrieval_host.ingest.settings import HTML, IngestLimits, invalid_document, too_complex

# Fed to the tokenizer in slices of this many characters, with a cancel check between them.
FEED_CHARS: Final = 256 * 1024
DECLARATION_BYTES: Final = 4096

_SKIP_TAGS: Final = frozenset(
    "script style template noscript iframe object svg title textarea select".split()
)
_HEADINGS: Final = {f"h{level}": level for level in range(1, 7)}
_BLOCK_TAGS: Final = frozenset(
    "address article aside blockquote body br caption dd details div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hr html li main nav ol p pre section summary "
    "table tbody td tfoot th thead tr ul".split()
)
_BOMS: Final = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@dataclass
class _Section:
    path: tuple[str, ...]
    level: int  # 0 for the text before the first heading
    # Source line -> text pieces on it, and the block ids of its first and last piece.
    pieces: dict[int, list[str]] = field(default_factory=dict)
    first_block: dict[int, int] = field(default_factory=dict)
    last_block: dict[int, int] = field(default_factory=dict)
    code_lines: set[int] = field(default_factory=set)
    heading_only: bool = True


def extract_html(
    data: bytes, title: str | None, limits: IngestLimits, cancel: CancelToken | None
) -> Extracted:
    """Decode, tokenize and section an HTML document (see the module docstring)."""
    source = normalize_text(_decode(data))
    reader, sections = _read(source, limits.max_html_elements, cancel)
    line_count = _line_count(source)
    segments: list[Segment] = []
    section_meta: list[dict[str, JSONValue]] = []
    for section, lines in sections:
        first, last = min(lines), max(lines)
        numbers = range(first, last + 1)
        segments.append(
            Segment(
                lines=tuple(lines.get(n, "") for n in numbers),
                first_line=first,
                blocks=_blocks(section, lines, first),
                path=tuple(clip(h, 200) for h in section.path),
            )
        )
        section_meta.append(
            {"headings": [clip(h, 200) for h in section.path], "startLine": first, "endLine": last}
        )

    metadata: dict[str, JSONValue] = {"mediaType": HTML, "lineCount": line_count}
    kept, truncated = bounded(section_meta)
    metadata["sections"] = kept
    if truncated:
        metadata["sectionsTruncated"] = True
    if title is None:
        # Read before heading-only sections were folded: an `h1` directly followed by an `h2`
        # is folded into it, and the title came out empty (a black-box test).
        h1 = next((s.path[0] for s in reader.sections if s.level == 1 and s.path), "")
        title = clip(reader.title_text(), 1024) or h1
    # The visible text line by line as in the source: a change that moves a cited line
    # changes the digest, and with it the revision.
    return Extracted(tuple(segments), _visible_text(sections, line_count), title, metadata)


def visible_lines(source: str, max_elements: int, cancel: CancelToken | None = None) -> str:
    """The visible text of the HTML `source` (decoded, LF line ends) line by line, by the rules
    of the module docstring: line n is the text a reader sees on source line n, blank where
    there is none. An HTML e-mail body is cited by these lines, so by its own."""
    _, sections = _read(source, max_elements, cancel)
    return _visible_text(sections, _line_count(source))


def _read(
    source: str, max_elements: int, cancel: CancelToken | None
) -> tuple[_Reader, list[tuple[_Section, dict[int, str]]]]:
    """The tokenizer run over `source`, and its sections with their visible lines (line
    number -> text; sections without any left out)."""
    reader = _Reader(max_elements)
    for start in range(0, len(source), FEED_CHARS):
        if cancel is not None:
            cancel.check()
        reader.feed(source[start : start + FEED_CHARS])
    reader.close()
    sections = []
    for section in _merge_heading_only(reader.sections):
        lines = {n: text for n in sorted(section.pieces) if (text := _line_text(section, n))}
        if lines:
            sections.append((section, lines))
    return reader, sections


def _line_count(source: str) -> int:
    return source.count("\n") + (0 if source.endswith("\n") or not source else 1)


def _visible_text(sections: list[tuple[_Section, dict[int, str]]], line_count: int) -> str:
    visible: dict[int, list[str]] = {}
    for _, lines in sections:
        for n, text in lines.items():
            visible.setdefault(n, []).append(text)
    return "\n".join(" ".join(visible.get(n, ())) for n in range(1, line_count + 1))


def _decode(data: bytes) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    if b"\x00" in data or data.lstrip().startswith(b"%PDF-"):
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH,
            "the bytes are not text, so they are not HTML.",
        )
    declared = EncodingDetector.find_declared_encoding(data[:DECLARATION_BYTES], is_html=True)
    # Read as the HTML standard reads the label (`charsets.text_codec`: only its labels, ASCII
    # and ISO-8859-1 as windows-1252). A declaration of UTF-16 in bytes that are not UTF-16
    # (no BOM) means UTF-8 (the standard's rule).
    info = text_codec(declared)
    if info is not None and not info.name.startswith("utf-16"):
        if info.name == "x-user-defined":  # the standard's rule for a page declaring it
            info = codecs.lookup("cp1252")
        with contextlib.suppress(Exception):  # a codec that fails anyway: read as undeclared
            return info.decode(data, "replace")[0]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("windows-1252", errors="replace")


def _line_text(section: _Section, line: int) -> str:
    text = "".join(section.pieces[line])
    if line in section.code_lines:
        return text.rstrip()
    return " ".join(text.split())


def _blocks(section: _Section, lines: dict[int, str], first: int) -> tuple[Block, ...]:
    """Runs of non-blank lines whose text belongs to one block element."""
    runs: list[list[int]] = []
    for n in sorted(lines):
        run = runs[-1] if runs else None
        if (
            run is not None
            and run[-1] == n - 1
            and section.last_block[n - 1] == section.first_block[n]
        ):
            run.append(n)
        else:
            runs.append([n])
    return tuple(
        Block(run[0] - first, run[-1] - first + 1, code=all(n in section.code_lines for n in run))
        for run in runs
    )


def _merge_heading_only(sections: list[_Section]) -> list[_Section]:
    """Fold a heading with no text of its own into the deeper heading that follows it."""
    merged: list[_Section] = []
    carry: _Section | None = None
    for index, section in enumerate(sections):
        if carry is not None:
            for line, pieces in carry.pieces.items():
                if line in section.pieces:
                    section.pieces[line] = [*pieces, " ", *section.pieces[line]]
                    section.first_block[line] = carry.first_block[line]
                else:
                    section.pieces[line] = pieces
                    section.first_block[line] = carry.first_block[line]
                    section.last_block[line] = carry.last_block[line]
            section.code_lines |= carry.code_lines
            carry = None
        following = sections[index + 1] if index + 1 < len(sections) else None
        if (
            section.level > 0
            and section.heading_only
            and following is not None
            and following.level > section.level
        ):
            carry = section
            continue
        merged.append(section)
    return merged


class _Reader(HTMLParser):
    """The tokenizer's events, kept per section and per source line."""

    def __init__(self, max_elements: int) -> None:
        super().__init__(convert_charrefs=False)
        self.sections = [_Section((), 0)]
        self._max_elements = max_elements
        self._elements = 0
        self._skipping: list[str] = []  # open elements whose content is not text
        self._pre = 0
        self._block = 0  # increases at every block boundary
        self._heading: int | None = None  # the level of the open heading element
        self._heading_text: list[str] = []
        self._stack: list[tuple[int, str]] = []
        self._title: list[str] = []
        self._in_title = False

    def title_text(self) -> str:
        # The title's content reached `handle_data` raw (see `_open`): decode its references.
        return " ".join(html_text.unescape("".join(self._title)).split())

    # --- tags ----------------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        self._open(tag, void=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        self._open(tag, void=True)

    def _count(self) -> None:
        self._elements += 1
        if self._elements > self._max_elements:
            raise too_complex(
                DocumentTooComplexReason.HTML_ELEMENTS,
                f"the HTML document has more than {self._max_elements} elements.",
            )

    def _open(self, tag: str, *, void: bool) -> None:
        if tag in _BLOCK_TAGS:
            self._block += 1
        if self._skipping:
            if tag in _SKIP_TAGS and not void:
                self._skipping.append(tag)
            return
        if tag in _SKIP_TAGS:
            if not void:
                self._skipping.append(tag)
                self._in_title = tag == "title"
                if self._in_title:
                    # RCDATA: up to `</title>` everything is text, a `<script>` included. The
                    # tokenizer knows raw text for `script` and `style` only; told so, it hands
                    # the content over in one piece, references undecoded.
                    self.set_cdata_mode(tag)
            return
        level = _HEADINGS.get(tag)
        if level is not None and self._heading is None and not void:
            self._heading = level
            self._heading_text = []
            while self._stack and self._stack[-1][0] >= level:
                self._stack.pop()
            self._stack.append((level, ""))
            self.sections.append(_Section(tuple(h for _, h in self._stack), level))
        elif tag == "pre" and not void:
            self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _BLOCK_TAGS:
            self._block += 1
        if self._skipping:
            if tag in self._skipping:
                while self._skipping.pop() != tag:
                    pass
                self._in_title = False
            return
        if tag in _HEADINGS and self._heading is not None:
            name = " ".join("".join(self._heading_text).split())
            level = self._heading
            self._heading = None
            self._stack[-1] = (level, name)
            section = self.sections[-1]
            section.path = tuple(h for _, h in self._stack)
        elif tag == "pre" and self._pre:
            self._pre -= 1

    # --- text ----------------------------------------------------------------------------

    def handle_data(self, data: str) -> None:
        self._text(data)

    def handle_entityref(self, name: str) -> None:
        self._text(_one_line(html_text.unescape(f"&{name};")))

    def handle_charref(self, name: str) -> None:
        self._text(_one_line(html_text.unescape(f"&#{name};")))

    def _text(self, data: str) -> None:
        if self._skipping:
            if self._in_title:
                self._title.append(data)
            return
        line, _ = self.getpos()
        section = self.sections[-1]
        if self._heading is not None:
            self._heading_text.append(data)
        elif data.strip():
            section.heading_only = False
        for offset, piece in enumerate(data.split("\n")):
            number = line + offset
            pieces = section.pieces.get(number)
            if pieces is None and not self._pre and not piece.strip():
                continue  # leading white space of a line: collapsed away anyway
            if pieces is None:
                pieces = section.pieces[number] = []
                section.first_block[number] = self._block
            elif section.last_block[number] != self._block:
                pieces.append(" ")  # two blocks on one line are two words at least
            pieces.append(piece)
            section.last_block[number] = self._block
            if self._pre:
                section.code_lines.add(number)


def _one_line(text: str) -> str:
    # `&#10;` decodes to a line break the source line does not have: keep lines the source's.
    return text.replace("\n", " ").replace("\r", " ")

"""Text normalization and bounded metadata shared by the extractors."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import Final

from retrieval_host.core.models import JSONValue
from retrieval_host.core.validation import json_bytes

_NEWLINES: Final = re.compile(r"\r\n?")
_SURROGATES: Final = re.compile("[\ud800-\udfff]")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NOT_BASE64: Final = re.compile(rb"[^A-Za-z0-9+/]")

# Source metadata must stay under core's 16 KiB (JSON in UTF-8). Lists that can grow with the
# document (sections, messages) get most of it; the rest is for scalar fields.
LIST_BUDGET_BYTES: Final = 11_000
FIELD_CHARS: Final = 300
# The byte-order marks of UTF-16 (little-, then big-endian): text, though not the UTF-8 that
# Markdown and plain text must be.
UTF16_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")


def normalize_text(text: str) -> str:
    """The one normalization every extracted text goes through.

    Line breaks become `\\n` (CRLF and lone CR alike), NUL characters are dropped (no store can
    keep them in text) and lone surrogates, which a broken PDF font map can produce and UTF-8
    cannot encode, become U+FFFD. Nothing else is touched: passage text stays the document's.
    """
    text = _NEWLINES.sub("\n", text)
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _SURROGATES.sub("\ufffd", text)


def unflowed(text: str, *, delsp: bool) -> str:
    """`format=flowed` text (RFC 3676) as its reader shows it: a line ending in a space goes
    on in the next line of the same quote depth (with `delsp`, without that space, so a word
    a mailer broke at a soft line end is whole again); space-stuffing is removed; `-- ` (a
    signature separator) is a line of its own. Each paragraph keeps its first line's quote
    markers."""
    out: list[str] = []
    paragraph: list[str] = []
    prefix, depth = "", -1
    for line in text.split("\n"):
        quotes = len(line) - len(line.lstrip(">"))
        body = line[quotes:]
        marker = line[:quotes]
        if body.startswith(" "):  # stuffed (or the space after `>` markers)
            body, marker = body[1:], marker + " " if quotes else marker
        if paragraph and (quotes != depth or body == "-- "):
            # a flowed paragraph ends where the depth changes, and before a signature
            out.append(prefix + "".join(paragraph))
            paragraph = []
        if not paragraph:
            prefix, depth = marker, quotes
        flowed = body.endswith(" ") and body != "-- "
        paragraph.append(body[:-1] if flowed and delsp else body)
        if not flowed:
            out.append(prefix + "".join(paragraph))
            paragraph = []
    if paragraph:
        out.append(prefix + "".join(paragraph))
    return "\n".join(out)


def base64_body(encoded: bytes) -> bytes | None:
    """A base64 body (RFC 2045) decoded, or None when it is not base64. Line breaks and white
    space around lines are skipped, missing padding is added, and a last group cut short (one
    character: a message cut off) is dropped. Any other character, a space within a line or
    `=` before the end included, means text labelled base64 that is something else: decoding
    around it, as the RFC allows and Python's parser does, makes bytes its sender never wrote,
    which would be indexed as text."""
    data = b"".join(line.strip() for line in encoded.splitlines()).rstrip(b"=")
    if _NOT_BASE64.search(data):
        return None
    data = data[: len(data) - (len(data) % 4 == 1)]
    return base64.b64decode(data + b"=" * (-len(data) % 4))


def clip(value: str, limit: int = FIELD_CHARS) -> str:
    """A short single-line label for metadata: control characters removed, length bounded."""
    value = " ".join(_CONTROL.sub(" ", normalize_text(value)).split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def bounded(
    items: Iterable[Mapping[str, JSONValue]], budget: int = LIST_BUDGET_BYTES
) -> tuple[list[JSONValue], bool]:
    """Keep items in order while their JSON fits in `budget` bytes; say whether any were left."""
    kept: list[JSONValue] = []
    used = 2
    for item in items:
        size = json_bytes(item) + 2
        if used + size > budget:
            return kept, True
        kept.append(dict(item))
        used += size
    return kept, False

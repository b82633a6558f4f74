"""Plain text: paragraphs with the file's line numbers, like Markdown without headings.

Plain text must be UTF-8 (a leading BOM is dropped), for the reason Markdown must: guessing
another encoding would silently change the text and the revision, so undecodable bytes are
refused with `INVALID_DOCUMENT` / `text-not-utf8`, and NUL bytes or a PDF header mean the
file is not text at all (`content-type-mismatch`). The whole file is one segment; blank lines
separate the paragraphs a passage keeps whole when it can. Line numbers are the file's,
counted after CRLF/CR become LF.
"""

from __future__ import annotations

from retrieval_host.core.models import JSONValue
from retrieval_host.core.reasons import InvalidDocumentReason
from retrieval_host.ingest._text import UTF16_BOMS, clip, normalize_text
from retrieval_host.ingest.chunking import Extracted, Segment, paragraph_blocks
from retrieval_host.ingest.settings import TEXT, invalid_document


def extract_plain_text(data: bytes, title: str | None) -> Extracted:
    """Decode a plain-text file into one segment of numbered lines (see the module docstring).

    The default title is the first non-blank line, as a reader would name the file."""
    if data.startswith(UTF16_BOMS):
        # Text, in another encoding than the one required: say what to do about it.
        raise invalid_document(
            InvalidDocumentReason.TEXT_NOT_UTF8,
            "Plain text must be UTF-8 (this file is UTF-16); convert the file first.",
        )
    if b"\x00" in data or data.lstrip().startswith(b"%PDF-"):
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH,
            "the bytes are not text, so they are not plain text.",
        )
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_document(
            InvalidDocumentReason.TEXT_NOT_UTF8,
            "plain text must be UTF-8; convert the file first.",
        ) from exc
    text = normalize_text(raw.removeprefix("\ufeff"))
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    segments = (Segment(tuple(lines), 1, paragraph_blocks(lines)),) if lines else ()
    metadata: dict[str, JSONValue] = {"mediaType": TEXT, "lineCount": len(lines)}
    if title is None:
        title = clip(next((line for line in lines if line.strip()), ""), 200)
    return Extracted(segments, text, title, metadata)

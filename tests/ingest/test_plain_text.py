"""Plain-text ingestion: paragraphs with the file's line numbers, UTF-8 only."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import PreparedDocument, media_type_for_path, prepare_document
from tests.ingest.conftest import TokenCounter

NOTES = (
    "Harbour notes\r\n"
    "\r\n"
    "Boats moor on the east quay.\r\n"
    "Fees are paid at the office.\r\n"
    "\r\n"
    "\r\n"
    "In winter the west quay closes.\r\n"
)


def prepare(data: bytes, count_tokens: TokenCounter) -> PreparedDocument:
    return prepare_document(data, "text/plain", source_id="notes.txt", token_counter=count_tokens)


def test_passages_cite_the_files_own_lines(count_tokens: TokenCounter) -> None:
    prepared = prepare(NOTES.encode(), count_tokens)
    source_lines = NOTES.replace("\r\n", "\n").split("\n")
    assert prepared.source.title == "Harbour notes"
    assert prepared.source.metadata == {"mediaType": "text/plain", "lineCount": 7}
    (chunk,) = prepared.chunks
    assert (chunk.location.start_line, chunk.location.end_line) == (1, 7)
    cited = source_lines[0:7]
    assert chunk.text == "\n".join(cited)


def test_long_text_splits_at_paragraphs_with_exact_ranges(count_tokens: TokenCounter) -> None:
    paragraphs = [f"Paragraph {i} says the quay number {i} is open at dawn." for i in range(60)]
    data = "\n\n".join(paragraphs).encode()
    prepared = prepare(data, count_tokens)
    assert len(prepared.chunks) > 1
    lines = data.decode().split("\n")
    for chunk in prepared.chunks:
        start, end = chunk.location.start_line, chunk.location.end_line
        assert start is not None and end is not None
        assert chunk.text == "\n".join(lines[start - 1 : end])
        assert lines[start - 1].startswith("Paragraph")  # never starts mid-paragraph


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("café".encode("latin-1"), "text-not-utf8"),
        ("café\nnoir\n".encode("utf-16"), "text-not-utf8"),  # with its byte-order mark
        (b"text\x00with a NUL", "content-type-mismatch"),
        (b"%PDF-1.7\n", "content-type-mismatch"),
        (b" \n\t\n", "empty-document"),
    ],
)
def test_text_that_is_not_utf8_text_is_refused_with_a_reason(
    data: bytes, reason: str, count_tokens: TokenCounter
) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(data, count_tokens)
    assert (caught.value.code, caught.value.reason) == (ErrorCode.INVALID_DOCUMENT, reason)


def test_the_same_text_with_other_line_endings_keeps_its_revision(
    count_tokens: TokenCounter,
) -> None:
    crlf = prepare(NOTES.encode(), count_tokens)
    lf = prepare(NOTES.replace("\r\n", "\n").encode(), count_tokens)
    assert crlf.source.revision == lf.source.revision
    other = prepare(NOTES.replace("east", "west").encode(), count_tokens)
    assert other.source.revision != lf.source.revision


def test_txt_and_html_files_have_media_types() -> None:

    assert media_type_for_path(Path("a/notes.TXT")) == "text/plain"
    assert media_type_for_path(Path("page.html")) == "text/html"
    assert media_type_for_path(Path("page.htm")) == "text/html"
    with pytest.raises(RetrievalError) as caught:
        media_type_for_path(Path("report.docx"))
    assert caught.value.reason == "unknown-suffix"

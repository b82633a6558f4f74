"""PDF ingestion: text per page, passages located by page and lines, typed failures."""

from __future__ import annotations

import io
import re

import pypdf
import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import ChunkingSettings, prepare_document
from tests.ingest.conftest import TokenCounter
from tests.support import ingest_documents as docs

PAGES = [
    [f"Page one, line {n}: the ferry schedule changes in spring." for n in range(1, 13)],
    [
        "Page two opens with the harbour rules.",
        "Boats moor on the east quay only.",
        "The orchid access code is 7781 and expires in May.",
        *[f"Page two, line {n}: anchors are checked each morning." for n in range(4, 11)],
    ],
    [f"Page three, line {n}: the lighthouse lamp is cleaned weekly." for n in range(1, 9)],
]


def assert_located(text: str, page_lines: list[str], start: int, end: int) -> None:
    """`text` is exactly what lines start..end of the page hold (first/last possibly partial)."""
    parts = text.split("\n")
    assert len(parts) == end - start + 1
    assert page_lines[start - 1].endswith(parts[0])
    assert page_lines[end - 1].startswith(parts[-1])
    assert parts[1:-1] == page_lines[start : end - 1]


def refusal(data: bytes, count_tokens: TokenCounter) -> RetrievalError:
    """The error a PDF is refused with."""
    with pytest.raises(RetrievalError) as caught:
        prepare_document(data, "application/pdf", source_id="x", token_counter=count_tokens)
    return caught.value


def test_known_text_comes_back_with_its_page_and_lines(count_tokens: TokenCounter) -> None:
    data = docs.text_pdf(PAGES)
    prepared = prepare_document(
        data,
        "application/pdf",
        source_id="harbour.pdf",
        token_counter=count_tokens,
        settings=ChunkingSettings(max_tokens=64, overlap_tokens=8),
    )
    assert len(prepared.chunks) > 3
    for chunk in prepared.chunks:
        loc = chunk.location
        assert loc.page is not None and loc.start_line is not None and loc.end_line is not None
        assert loc.document_id is None
        assert_located(chunk.text, PAGES[loc.page - 1], loc.start_line, loc.end_line)
    orchid = [c for c in prepared.chunks if "orchid access code is 7781" in c.text]
    assert orchid
    for chunk in orchid:
        assert chunk.location.page == 2
        assert chunk.location.start_line is not None and chunk.location.end_line is not None
        assert chunk.location.start_line <= 3 <= chunk.location.end_line
    assert {c.location.page for c in prepared.chunks} == {1, 2, 3}
    assert prepared.source.metadata["pageCount"] == 3


def test_every_line_of_every_page_is_in_some_passage(count_tokens: TokenCounter) -> None:
    prepared = prepare_document(
        docs.text_pdf(PAGES),
        "application/pdf",
        source_id="harbour.pdf",
        token_counter=count_tokens,
        settings=ChunkingSettings(max_tokens=48, overlap_tokens=0),
    )
    for number, lines in enumerate(PAGES, start=1):
        on_page = "\n".join(c.text for c in prepared.chunks if c.location.page == number)
        for line in lines:
            assert line in on_page or all(part in on_page for part in line.split(". "))


def test_the_pdf_info_title_is_the_default_title(count_tokens: TokenCounter) -> None:
    data = docs.text_pdf([["Some text."]], title="Harbour Rules")
    prepared = prepare_document(data, "application/pdf", source_id="h", token_counter=count_tokens)
    assert prepared.source.title == "Harbour Rules"
    explicit = prepare_document(
        data, "application/pdf", source_id="h", title="Mine", token_counter=count_tokens
    )
    assert explicit.source.title == "Mine"


def _with_info(data: bytes, info: dict[str, str]) -> bytes:
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    writer.add_metadata(info)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("stated", "stored"),
    [
        ("D:20240301230000-05'00'", "2024-03-02T04:00:00Z"),
        ("D:20240302090000+09'00'", "2024-03-02T00:00:00Z"),
        ("D:20240302010000", "2024-03-02T01:00:00"),  # no offset: as stated
        # Outside the calendar in UTC: the field is left out, the document still indexed.
        ("D:00010101000000+05'00'", None),
        ("D:99991231230000-05'00'", None),
    ],
)
def test_pdf_dates_with_an_offset_are_stored_in_utc_so_ranges_compare(
    count_tokens: TokenCounter, stated: str, stored: str | None
) -> None:
    """Filters compare strings by code point: with each file's own offset kept, a range
    `{"gte": "2024-03-02"}` left out a file created on 2 March in UTC (a black-box test)."""
    data = _with_info(docs.text_pdf([["Some text."]]), {"/CreationDate": stated})
    prepared = prepare_document(data, "application/pdf", source_id="h", token_counter=count_tokens)
    assert prepared.source.metadata.get("created") == stored


def test_the_pdf_info_is_metadata_a_filter_can_use(count_tokens: TokenCounter) -> None:
    data = _with_info(
        docs.text_pdf([["Some text."]], title="Harbour Rules"),
        {
            "/Author": "Jane Roe",
            "/Subject": "Mooring\x00 rules",
            "/Keywords": "harbour; quay",
            "/CreationDate": "D:20240102030405Z",
            "/ModDate": "D:not a date",
        },
    )
    prepared = prepare_document(data, "application/pdf", source_id="h", token_counter=count_tokens)
    metadata = prepared.source.metadata
    assert metadata["author"] == "Jane Roe"
    assert metadata["subject"] == "Mooring rules"
    assert metadata["keywords"] == "harbour; quay"
    assert metadata["created"] == "2024-01-02T03:04:05Z"
    assert "modified" not in metadata  # unreadable: left out, the text still indexed
    plain = prepare_document(
        docs.text_pdf([["Some text."]]),
        "application/pdf",
        source_id="h",
        token_counter=count_tokens,
    )
    assert not {"author", "subject", "keywords"} & set(plain.source.metadata)


def test_a_password_protected_pdf_is_refused_as_encrypted(count_tokens: TokenCounter) -> None:
    locked = docs.encrypted_pdf(docs.text_pdf([["Secret harbour plan."]]), user_password="pw")
    with pytest.raises(RetrievalError) as caught:
        prepare_document(locked, "application/pdf", source_id="x", token_counter=count_tokens)
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "pdf-encrypted"


def test_a_pdf_restricted_only_by_an_owner_password_is_read(count_tokens: TokenCounter) -> None:
    restricted = docs.encrypted_pdf(
        docs.text_pdf([["Open harbour plan."]]), user_password="", algorithm="AES-128"
    )
    prepared = prepare_document(
        restricted, "application/pdf", source_id="x", token_counter=count_tokens
    )
    assert [c.text for c in prepared.chunks] == ["Open harbour plan."]


def test_a_pdf_without_a_text_layer_says_so(count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare_document(
            docs.drawing_only_pdf(), "application/pdf", source_id="x", token_counter=count_tokens
        )
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "pdf-no-text-layer"


@pytest.mark.parametrize(
    "labels",
    [
        ["Page 1", "Page 2"],
        ["- 1 -", "2 of 2"],
        ["ACME000123", "ACME000124"],
        ["1", "p. 2"],
        ["PAGE 1", "Seite 2 von 2"],
        # A page number and a Bates stamp on one page, a line each.
        ["Page 1\nACME000123", "ACME000124\n2"],
    ],
)
def test_a_scan_whose_only_text_is_its_page_numbers_has_no_text_layer(
    count_tokens: TokenCounter, labels: list[str]
) -> None:
    # Probe A (session 35): a scanned contract with a digital page number was "indexed" as
    # passages "Page 1" and "Page 2", while without them it was refused as needing OCR.
    error = refusal(docs.text_pdf([label.split("\n") for label in labels]), count_tokens)
    assert (error.code, error.reason) == (ErrorCode.INVALID_DOCUMENT, "pdf-no-text-layer")
    assert "only text is page numbers" in error.detail
    # A page of text keeps its number; a page of only a number beside it is not a passage.
    prepared = prepare_document(
        docs.text_pdf([["Harbour dues are paid monthly.", "Page 1"], ["Page 2"]]),
        "application/pdf",
        source_id="x",
        token_counter=count_tokens,
    )
    assert [c.location.page for c in prepared.chunks] == [1]
    assert prepared.source.metadata["pagesWithText"] == 1


@pytest.mark.parametrize(
    "pages",
    [
        [["Strategy 2030"], ["Our plan for the decade ahead is growth."]],
        [["Report 2024"]],
        [["ISO 9001"], ["Quality manual body text."]],
        # Probe W (session 35): a hyphen is no stamp, a number past the page count no number.
        [["ISO-27001"], ["Information security policy body text."]],
        [["2024"], ["Body text of the yearly review follows here."]],
        [["Handbook"], ["Copyright 2024"], ["Body text here about safety."]],
        [["Price list"], ["1200", "3400", "5600", "7800"]],
        [["Price list"], ["1200", "3400"]],
    ],
)
def test_a_short_page_of_words_or_figures_is_text_not_a_page_number(
    count_tokens: TokenCounter, pages: list[list[str]]
) -> None:
    # A black-box test: "Strategy 2030", "ISO 9001" and "Copyright 2024" pages were dropped
    # as Bates stamps, a page of figures as page numbers, and a one-page "Report 2024" was
    # refused as "only page numbers".
    prepared = prepare_document(
        docs.text_pdf(pages), "application/pdf", source_id="x", token_counter=count_tokens
    )
    assert {c.location.page for c in prepared.chunks} == set(range(1, len(pages) + 1))
    assert prepared.source.metadata["pagesWithText"] == len(pages)
    text = "\n".join(c.text for c in prepared.chunks)
    assert all(line in text for lines in pages for line in lines)


def test_a_page_whose_glyphs_no_font_maps_is_a_page_without_text(
    count_tokens: TokenCounter,
) -> None:
    # Black-box tests: such a page was indexed as a passage of U+FFFD, searchable and cited,
    # and counted in `pagesWithText`; then still so when its page number was readable.
    for data in (docs.missing_font_pdf(), docs.missing_font_pdf(page_number=True)):
        assert "\ufffd" in pypdf.PdfReader(io.BytesIO(data)).pages[1].extract_text()
        prepared = prepare_document(
            data, "application/pdf", source_id="x", token_counter=count_tokens
        )
        assert [c.location.page for c in prepared.chunks] == [1]
        assert "\ufffd" not in "".join(c.text for c in prepared.chunks)
        metadata = prepared.source.metadata
        assert (metadata["pageCount"], metadata["pagesWithText"]) == (2, 1)
    error = refusal(docs.missing_font_pdf(readable_page=False), count_tokens)
    assert (error.code, error.reason) == (ErrorCode.INVALID_DOCUMENT, "pdf-no-text-layer")
    assert "cannot be decoded" in str(error)


def test_a_damaged_page_refuses_the_pdf_and_is_named(count_tokens: TokenCounter) -> None:
    # A black-box test: "the PDF could not be read" did not tell one bad page from a broken file.
    with pytest.raises(RetrievalError) as caught:
        prepare_document(
            docs.damaged_page_pdf(), "application/pdf", source_id="x", token_counter=count_tokens
        )
    assert (caught.value.code, caught.value.reason) == (
        ErrorCode.INVALID_DOCUMENT,
        "pdf-malformed",
    )
    assert caught.value.detail.startswith("page 2 of the PDF could not be read")
    # So is a page whose stream does not decode, found while the streams are measured (probe
    # A, session 35: "the PDF could not be read").
    error = refusal(docs.undecodable_stream_pdf(), count_tokens)
    assert error.reason == "pdf-malformed"
    assert error.detail.startswith("page 2 of the PDF could not be read")


def test_a_page_whose_flate_stream_does_not_inflate_refuses_the_pdf(
    count_tokens: TokenCounter,
) -> None:
    # A black-box test: pypdf logs zlib's error and reads such a page as empty, and the file
    # was indexed without it.
    whole = prepare_document(
        docs.flate_page_pdf(), "application/pdf", source_id="x", token_counter=count_tokens
    )
    assert {c.location.page for c in whole.chunks} == {1, 2}
    assert "Second page text behind a Flate filter" in "\n".join(c.text for c in whole.chunks)
    damaged = docs.flate_page_pdf(damaged=True)
    assert pypdf.PdfReader(io.BytesIO(damaged)).pages[1].extract_text() == ""
    with pytest.raises(RetrievalError) as caught:
        prepare_document(damaged, "application/pdf", source_id="x", token_counter=count_tokens)
    assert (caught.value.code, caught.value.reason) == (
        ErrorCode.INVALID_DOCUMENT,
        "pdf-malformed",
    )
    assert caught.value.detail.startswith("page 2 of the PDF could not be read")


def test_a_page_whose_flate_stream_is_cut_short_refuses_the_pdf(
    count_tokens: TokenCounter,
) -> None:
    # Probe W (session 35): pypdf inflates the half that is there without logging, and the
    # file was indexed with page 2 empty. A bad checksum or a line end after the data is
    # no damage: the text is all there.
    truncated = docs.flate_page_pdf(truncated=True)
    assert "Second page" not in pypdf.PdfReader(io.BytesIO(truncated)).pages[1].extract_text()
    error = refusal(truncated, count_tokens)
    assert (error.code, error.reason) == (ErrorCode.INVALID_DOCUMENT, "pdf-malformed")
    assert error.detail.startswith("page 2 of the PDF could not be read")
    for data in (docs.flate_page_pdf(bad_checksum=True), docs.flate_page_pdf(tail=b"\r\n")):
        prepared = prepare_document(
            data, "application/pdf", source_id="x", token_counter=count_tokens
        )
        assert {c.location.page for c in prepared.chunks} == {1, 2}
        assert "behind a Flate filter" in "\n".join(c.text for c in prepared.chunks)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        # A file cut short says so (probe A, session 35): its sender can fetch it again.
        pytest.param(docs.one_page_pdf()[:180], "looks cut short", id="truncated"),
        pytest.param(
            docs.one_page_pdf().rstrip().removesuffix(b"%%EOF"), "looks cut short", id="no-eof"
        ),
        pytest.param(b"%PDF-1.7\n" + bytes(range(256)) * 8, "cut short", id="garbage-after-header"),
        pytest.param(docs.cyclic_page_tree_pdf(), "could not be read", id="cyclic-page-tree"),
    ],
)
def test_an_unreadable_pdf_is_malformed(data: bytes, said: str, count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare_document(data, "application/pdf", source_id="x", token_counter=count_tokens)
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "pdf-malformed"
    assert said in caught.value.detail


def test_a_page_whose_content_is_not_a_stream_refuses_the_document(
    count_tokens: TokenCounter,
) -> None:
    # A damaged object (its `stream` keyword spoiled) reads as a dictionary: pypdf would give
    # the page no text, and the document would replace the previous revision a page short.
    good = docs.text_pdf(PAGES)
    assert good.count(b"stream") >= 2
    damaged = good.replace(b"stream", b"streax", 2)
    with pytest.raises(RetrievalError) as caught:
        prepare_document(damaged, "application/pdf", source_id="x", token_counter=count_tokens)
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "pdf-malformed"
    assert "page 1" in caught.value.detail
    # The same document undamaged reads, every page.
    prepared = prepare_document(good, "application/pdf", source_id="x", token_counter=count_tokens)
    assert {c.location.page for c in prepared.chunks} == {1, 2, 3}


def test_a_repairable_self_referencing_xref_still_reads(count_tokens: TokenCounter) -> None:
    prepared = prepare_document(
        docs.self_referencing_xref_pdf(),
        "application/pdf",
        source_id="x",
        token_counter=count_tokens,
    )
    assert [c.text for c in prepared.chunks] == ["Hello from a hand-made page"]
    assert prepared.chunks[0].location.page == 1


def test_bytes_that_are_not_a_pdf_are_a_content_type_mismatch(
    count_tokens: TokenCounter,
) -> None:
    assert refusal(b"# A Markdown file\n\nNot a PDF.\n", count_tokens).reason == (
        "content-type-mismatch"
    )


def test_a_page_whose_form_xobjects_pypdf_stops_following_is_refused(
    count_tokens: TokenCounter,
) -> None:
    # A black-box test: past 5,000 form draws pypdf skipped the rest of the page's forms and
    # the page was indexed without their text, `indexed` and no word of it.
    whole = prepare_document(
        docs.form_fanout_pdf(10), "application/pdf", source_id="f", token_counter=count_tokens
    )
    assert "gizmo77" in "\n".join(c.text for c in whole.chunks)
    with pytest.raises(RetrievalError) as info:
        prepare_document(
            docs.form_fanout_pdf(5_200),
            "application/pdf",
            source_id="f",
            token_counter=count_tokens,
        )
    assert (info.value.code, info.value.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "pdf-operators")
    assert "page 1 draws more than 5000 form XObjects" in info.value.detail


def test_an_xref_declaring_more_entries_than_the_file_holds_is_malformed_not_too_large(
    count_tokens: TokenCounter,
) -> None:
    # A black-box test: a 769-byte file was refused 413 `pdf-resource-limit`.
    broken = re.sub(rb"xref\n0 \d+\n", b"xref\n0 65535\n", docs.one_page_pdf(), count=1)
    assert b"xref\n0 65535\n" in broken and len(broken) < 2048
    with pytest.raises(RetrievalError) as info:
        prepare_document(broken, "application/pdf", source_id="x", token_counter=count_tokens)
    assert (info.value.code, info.value.reason) == (ErrorCode.INVALID_DOCUMENT, "pdf-malformed")
    assert "cross-reference table" in info.value.detail


def test_document_information_strings_ending_in_nul_read_as_text(
    count_tokens: TokenCounter,
) -> None:
    # A black-box test: `(Pump manual\000)` was read as UTF-16 ('畐灭洠湡慵l'), `(Bob\000)`
    # dropped: C writers end strings with NUL.
    info = (
        rb"/Title (Pump manual\000) /Author (Bob\000) /Subject (Odd subject\000\000)"
        rb" /Keywords <FEFF00500075006D0070>"
    )
    prepared = prepare_document(
        docs.one_page_pdf_with_info(info),
        "application/pdf",
        source_id="p",
        token_counter=count_tokens,
    )
    assert prepared.source.title == "Pump manual"
    metadata = prepared.source.metadata
    assert (metadata["author"], metadata["subject"]) == ("Bob", "Odd subject")
    assert metadata["keywords"] == "Pump"  # UTF-16 with its BOM, as before
    author_last = docs.one_page_pdf_with_info(rb"/Title <FEFF7EDF4E00> /Author <FEFF0100>")
    unified = prepare_document(
        author_last, "application/pdf", source_id="u", token_counter=count_tokens
    )
    # A review: UTF-16 text ending in a character whose low byte is 0 was dropped.
    assert unified.source.title == "\u7edf\u4e00"
    assert unified.source.metadata["author"] == "\u0100"


def test_a_pdf_encrypted_for_certificates_is_encrypted_not_malformed(
    count_tokens: TokenCounter,
) -> None:
    pdf = (
        docs.one_page_pdf_with_info(b"/Title (x)")
        .replace(b"/Info 6 0 R", b"/Info 6 0 R /Encrypt 6 0 R /ID [<01><01>]")
        .replace(b"<< /Title (x) >>", b"<< /Filter /Adobe.PubSec /V 4 /R 4 >>")
    )
    with pytest.raises(RetrievalError) as info:
        prepare_document(pdf, "application/pdf", source_id="e", token_counter=count_tokens)
    assert (info.value.code, info.value.reason) == (ErrorCode.INVALID_DOCUMENT, "pdf-encrypted")
    assert "certificates" in info.value.detail

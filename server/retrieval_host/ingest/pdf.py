"""PDF: text per page with pypdf, each passage located by page and by lines on that page.

Untrusted PDFs are read in pypdf's lenient mode (real-world files are often slightly broken and
pypdf repairs what it safely can) under tighter resource bounds than pypdf's defaults:

- every decoder (Flate, LZW, run-length, JBIG2, Brotli) stops at `MAX_STREAM_OUTPUT` bytes of
  output per stream, so a decompression bomb costs megabytes, not gigabytes;
- the page tree is walked by pypdf with an explicit stack, bounded in depth and in entries
  (about two per allowed page), after the declared `/Count` has been checked against
  `IngestLimits.max_pages`; cycles are detected by pypdf; no text is extracted before both pass;
- no external decoder binary (jbig2dec) is ever run;
- the extracted text is bounded by `IngestLimits.max_bytes` in total.

- the content streams of every page are measured before any text is extracted: decoded
  bytes per page and (estimated) operators per page and per document, the interpreter's cost
  (`DOCUMENT_TOO_COMPLEX`, `pdf-content-stream` or `pdf-operators`; see `IngestLimits`).

Outcomes: a limit → `PAYLOAD_TOO_LARGE` (`pages`, `bytes` or `pdf-resource-limit`); a
password → `INVALID_DOCUMENT`/`pdf-encrypted` (a file encrypted with an empty user password,
i.e. only restricted by an owner password, opens as any viewer would open it); no text on any
page → `pdf-no-text-layer` (scanned images need OCR first; a page whose only text is its
page number or a Bates stamp counts as a page without text, and is not indexed); anything
pypdf cannot read → `pdf-malformed`. Line numbers count the lines of `page.extract_text()`
for that page, from 1.
"""

from __future__ import annotations

import codecs
import logging
import re
import threading
import zlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from io import BytesIO
from typing import Any, Final

import pypdf
from pypdf import PageObject, PasswordType
from pypdf.errors import LimitReachedError, PdfStreamError
from pypdf.generic import (
    ArrayObject,
    ByteStringObject,
    NullObject,
    StreamObject,
    TextStringObject,
    create_string_object,
)

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import JSONValue
from retrieval_host.core.reasons import (
    DocumentTooComplexReason,
    InvalidDocumentReason,
    PayloadTooLargeReason,
)
from retrieval_host.ingest._text import clip, normalize_text
from retrieval_host.ingest.chunking import Extracted, Segment, paragraph_blocks
from retrieval_host.ingest.settings import (
    PDF,
    IngestLimits,
    MiB,
    invalid_document,
    too_complex,
    too_large,
)

MAX_STREAM_OUTPUT: Final = 16 * MiB
# Acrobat accepts the header anywhere in the first KiB; so does this check.
_HEADER_WINDOW: Final = 1024
# A content-stream operator as a bare word (`Tj`, `BT`, `re`, `T*`) or a quote operator, not
# part of a name (`/F1`), a number or a longer keyword.
_OPERATOR: Final = re.compile(
    rb"(?<![A-Za-z0-9_.#/+\-])(?:[A-Za-z][A-Za-z0-9*]{0,2}|'|\")(?![A-Za-z0-9_*])"
)

_log = logging.getLogger(__name__)


class _Noted(threading.local):
    """What pypdf's log said while this thread read (`_PypdfLog`); each thread starts False."""

    skipped_forms = False
    damaged_stream = False


class _PypdfLog(logging.Handler):
    """pypdf's log. It logs every repair it makes to a damaged file as a warning: for uploaded
    files that is log volume an attacker controls (one line per broken object), so warnings
    are dropped. Errors are logged as pypdf's message template, not its arguments, which are
    what it read from the file (a font's `/Encoding` name holding line feeds once forged log
    lines, probe S, session 38; no document text is logged, `http/logs.py`); a message given
    without arguments only by the module that logged it. Two warnings matter, each noted for
    the thread that reads: text extraction gave up on a page's form XObjects past its
    invocation bound and returned the text before them (`skipped_forms`); and a Flate stream
    failed to inflate, for which pypdf logs zlib's error ("Error -3 while decompressing data:
    invalid code lengths set") and returns only the bytes before the damage, often none
    (`damaged_stream`).
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.noted = _Noted()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            # A message without arguments may have been formatted by pypdf itself.
            what = str(record.msg) if record.args else "an error (it may quote the file)"
            _log.error("%s: %s", record.name, what)
        elif "form XObject invocations" in str(record.msg):
            self.noted.skipped_forms = True
        elif record.name == "pypdf.filters" and "while decompressing" in str(record.msg):
            self.noted.damaged_stream = True


_PYPDF_LOG: Final = _PypdfLog()
REPLACEMENT: Final = "\ufffd"  # what pypdf extracts for a glyph it cannot map to text
_pypdf_logger = logging.getLogger("pypdf")
_pypdf_logger.setLevel(logging.WARNING)
_pypdf_logger.propagate = False
_pypdf_logger.addHandler(_PYPDF_LOG)


# A line that only numbers its page: "3", "- 3 -", "Page 3", "p. 3 of 12", "3/12" (the words
# in any case); a page number only up to the document's page count ("2024" is a year).
_PAGE_NUMBER: Final = re.compile(
    r"(?i:(?:page|pg\.?|p\.|seite|p[aá]gina)\s*)?[-–—]?\s*(?P<n>\d{1,6})\s*"
    r"(?:(?i:of|/|von|de)\s*\d{1,6})?\s*[-–—]?"
)
# A Bates stamp: capitals directly followed by digits ("ACME000123"). Case-sensitive, without
# a space or hyphen, so "Report 2024", "ISO 9001" or "ISO-27001" are text (black-box tests:
# such title pages were dropped, and a one-page "Report 2024" refused).
_BATES_STAMP: Final = re.compile(r"[A-Z]{2,10}\d{4,10}")


def _only_page_labels(page_text: str, page_count: int) -> bool:
    """The page's only text is a page number, a Bates stamp, or one of each, a line each: a
    column of figures ("1200", "3400", ...) is text."""
    kinds = [
        _label_kind(line.strip(), page_count) for line in page_text.split("\n") if line.strip()
    ]
    return bool(kinds) and None not in kinds and len(set(kinds)) == len(kinds)


def _label_kind(line: str, page_count: int) -> str | None:
    number = _PAGE_NUMBER.fullmatch(line)
    if number and int(number["n"]) <= page_count:
        return "number"
    return "stamp" if _BATES_STAMP.fullmatch(line) else None


def _mostly_undecodable(page_text: str) -> bool:
    """At least half of the page's visible characters are U+FFFD."""
    unreadable = page_text.count(REPLACEMENT)
    return unreadable > 0 and 2 * unreadable >= sum(not c.isspace() for c in page_text)


# The PDF standard puts `%%EOF` in the last 1024 bytes of a file.
_EOF_WINDOW: Final = 1024


class _PageUnreadable(Exception):
    """pypdf failed on one page's content (the cause): which page, for the refusal."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


def extract_pdf(
    data: bytes, title: str | None, limits: IngestLimits, cancel: CancelToken | None
) -> Extracted:
    """Extract page texts (see the module docstring for the limits and the errors)."""
    if b"%PDF-" not in data[:_HEADER_WINDOW]:
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH, "the bytes do not start a PDF file."
        )
    configuration = pypdf.Configuration(
        maximum_declared_stream_length=limits.max_bytes,
        array_based_stream_maximum_output_length=MAX_STREAM_OUTPUT,
        jbig2_maximum_output_length=MAX_STREAM_OUTPUT,
        lzw_maximum_output_length=MAX_STREAM_OUTPUT,
        run_length_maximum_output_length=MAX_STREAM_OUTPUT,
        zlib_maximum_output_length=MAX_STREAM_OUTPUT,
        brotli_maximum_output_length=MAX_STREAM_OUTPUT,
        image_maximum_buffer_size=MAX_STREAM_OUTPUT,
        stream_decoding_work_maximum_length=4 * MAX_STREAM_OUTPUT,
        page_tree_maximum_entries=2 * limits.max_pages + 16,
        jbig2dec_binary=None,
    )
    try:
        with pypdf.apply_configuration(configuration):
            return _extract(data, title, limits, cancel)
    except RetrievalError:
        raise
    except _PageUnreadable as exc:
        # One damaged page refuses the file (indexing the rest would drop its text unseen);
        # the detail names it, so a broken file and one bad page can be told apart.
        _log.info("unreadable PDF page %d: %s", exc.number, type(exc.__cause__).__name__)
        raise invalid_document(
            InvalidDocumentReason.PDF_MALFORMED,
            f"page {exc.number} of the PDF could not be read (its content is damaged).",
        ) from exc.__cause__
    except LimitReachedError as exc:
        raise too_large(
            PayloadTooLargeReason.PDF_RESOURCE_LIMIT,
            "the PDF needs more memory or work than allowed to read.",
        ) from exc
    except RecursionError as exc:
        raise invalid_document(
            InvalidDocumentReason.PDF_MALFORMED, "the PDF could not be read."
        ) from exc
    except Exception as exc:
        # pypdf raises many exception types on hostile input (its own, ValueError, KeyError,
        # struct.error, ...); whichever it is, the file is unreadable, not the host broken.
        _log.info("unreadable PDF: %s", type(exc).__name__)
        raise invalid_document(InvalidDocumentReason.PDF_MALFORMED, _unreadable(data)) from exc


def _unreadable(data: bytes) -> str:
    """Why a PDF pypdf cannot read is refused: one that does not end with `%%EOF` looks cut
    short (a partial download or copy), which its sender can fix (probe A, session 35)."""
    if b"%%EOF" not in data[-_EOF_WINDOW:]:
        return (
            "the PDF could not be read: it does not end with %%EOF, so it looks cut short "
            "(a partial download or copy?)."
        )
    return "the PDF could not be read."


def _extract(
    data: bytes, title: str | None, limits: IngestLimits, cancel: CancelToken | None
) -> Extracted:
    try:
        reader = pypdf.PdfReader(BytesIO(data), strict=False)
    except NotImplementedError as exc:
        if "encryption" not in str(exc):
            raise
        # A certificate (`/Adobe.PubSec`) or another non-password handler: encrypted, and no
        # password would open it here (it was reported malformed, a black-box test).
        raise invalid_document(
            InvalidDocumentReason.PDF_ENCRYPTED,
            "the PDF is encrypted for certificates or another handler than a password: "
            "decrypt it before ingestion.",
        ) from exc
    except LimitReachedError as exc:
        if not str(exc).startswith("Declared size"):
            raise
        # An xref subsection declaring more entries than the file could hold: a 769-byte
        # file was refused as too large (a black-box report).
        raise invalid_document(
            InvalidDocumentReason.PDF_MALFORMED,
            "the PDF's cross-reference table is damaged: it declares more entries than the "
            "file holds.",
        ) from exc
    if reader.is_encrypted:
        try:
            opened = reader.decrypt("")
        except Exception as exc:  # an unsupported or broken encryption dictionary
            raise _encrypted() from exc
        if opened == PasswordType.NOT_DECRYPTED:
            raise _encrypted()

    declared = _declared_page_count(reader)
    if declared is not None and declared > limits.max_pages:
        raise _too_many_pages(limits, declared=True)
    try:
        pages = reader.pages
        count = len(pages)
    except LimitReachedError as exc:
        if "entry limit" in str(exc):  # pypdf's bound on page tree entries: too many pages
            raise _too_many_pages(limits) from exc
        # A page tree that refers to itself or nests past pypdf's depth bound: a one-page
        # file was refused as "more than 2000 pages" (a black-box report).
        raise invalid_document(
            InvalidDocumentReason.PDF_MALFORMED,
            "the PDF's page tree could not be read: it refers to itself or nests too deeply.",
        ) from exc
    if count > limits.max_pages:
        raise _too_many_pages(limits)
    if count == 0:
        raise invalid_document(InvalidDocumentReason.EMPTY_DOCUMENT, "the PDF has no pages.")

    _check_content_streams(pages, limits, cancel)
    texts: list[str] = []
    total = 0
    undecodable = 0  # pages whose every glyph extracted as U+FFFD
    labelled = 0  # pages whose only text is a page number or a Bates stamp
    segments: list[Segment] = []
    for number, page in enumerate(pages, start=1):
        if cancel is not None:
            cancel.check()
        _PYPDF_LOG.noted.skipped_forms = False
        try:
            page_text = normalize_text(page.extract_text())
        except (RetrievalError, LimitReachedError, RecursionError):
            raise
        except Exception as exc:
            raise _PageUnreadable(number) from exc
        if _PYPDF_LOG.noted.skipped_forms:
            # pypdf stops following form XObjects past its bound and returns the text before
            # them: indexed, the page would be short with nothing to say so.
            raise _too_many_operators(
                f"page {number} draws more than "
                f"{pypdf.get_configuration().xform_maximum_invocations_per_extraction} form "
                "XObjects; it has more than the allowed"
            )
        if cancel is not None:
            cancel.progress()
        total += len(page_text)
        if total > limits.max_bytes:
            raise too_large(PayloadTooLargeReason.BYTES, "the PDF's text is larger than allowed.")
        texts.append(page_text)
        if not page_text.strip():
            continue
        if _only_page_labels(page_text, count):
            # A scanned page whose only text layer is its page number or Bates stamp: no
            # text to index (probe A, session 35: a scan indexed as passages "Page 1", ...).
            labelled += 1
            continue
        if _mostly_undecodable(page_text):
            # Its glyphs came out as U+FFFD (a font without a usable encoding or ToUnicode
            # map), but for a page number or so: a passage of replacement characters is no text
            # (black-box tests saw one indexed, searchable and cited, with and without "Page 2").
            undecodable += 1
            continue
        lines = tuple(page_text.split("\n"))
        segments.append(Segment(lines, 1, paragraph_blocks(lines), page=number))
    if not segments:
        raise invalid_document(
            InvalidDocumentReason.PDF_NO_TEXT_LAYER,
            "the PDF's text cannot be decoded (its fonts map no glyph to a character)."
            if undecodable
            else "the PDF's only text is page numbers (scanned pages need OCR before ingestion)."
            if labelled
            else "the PDF has no text layer (scanned pages need OCR before ingestion).",
        )

    metadata: dict[str, JSONValue] = {
        "mediaType": PDF,
        "pageCount": count,
        "pagesWithText": len(segments),
    }
    metadata.update(_info_fields(reader))
    if title is None:
        title = _info_title(reader)
    return Extracted(tuple(segments), "\f".join(texts), title, metadata)


def _check_content_streams(
    pages: Sequence[PageObject], limits: IngestLimits, cancel: CancelToken | None
) -> None:
    """Refuse a PDF whose content streams would cost too much to interpret, before any text
    is extracted: decoded bytes per page, and operators per page and per document.

    Operators are estimated by a regular-expression scan of the decoded bytes (about 100 MB/s,
    against ~25 us per operator for pypdf's interpreter): bare words of one to three letters
    and the quote operators. Letters inside string operands count too, so the estimate runs
    high, 1.3-2x on measured real pages: the limits are set with that margin. Form XObjects
    on the page are added once each (their `Do` repeats them; the parse worker's CPU limit
    and the ingest deadline bound what the estimate misses).
    """
    document = 0
    for number, page in enumerate(pages, start=1):
        if cancel is not None:
            cancel.check()
        _check_contents_object(page, number)
        _PYPDF_LOG.noted.damaged_stream = False
        page_bytes = 0
        page_ops = 0
        streams = _page_streams(page)
        while True:
            try:
                data = next(streams, None)
            except LimitReachedError as exc:
                # One stream decodes past `MAX_STREAM_OUTPUT` (pypdf stops it): a page whose
                # content is too large, like several streams adding up past the limit.
                raise _content_too_large(limits) from exc
            except RetrievalError:
                raise
            except Exception as exc:
                # A stream that does not decode (a damaged Flate or ASCII85 filter) names its
                # page, as one that fails at extraction does (probe A, session 35).
                raise _PageUnreadable(number) from exc
            if data is None:
                break
            page_bytes += len(data)
            if page_bytes > limits.max_content_stream_bytes:
                raise _content_too_large(limits)
            page_ops += _count_operators(data, limits.max_page_operators - page_ops + 1)
            if page_ops > limits.max_page_operators:
                raise _too_many_operators(f"a page has more than {limits.max_page_operators}")
        if _PYPDF_LOG.noted.damaged_stream or any(map(_cut_short, _raw_streams(page))):
            # pypdf inflates a damaged Flate stream up to the damage and logs the rest away,
            # and one cut short without a word: the page would be indexed short or empty
            # (black-box tests: indexed without page 2).
            raise _PageUnreadable(number) from PdfStreamError("a Flate stream does not inflate")
        document += page_ops
        if document > limits.max_document_operators:
            raise _too_many_operators(f"the PDF has more than {limits.max_document_operators}")


def _content_too_large(limits: IngestLimits) -> RetrievalError:
    return too_complex(
        DocumentTooComplexReason.PDF_CONTENT_STREAM,
        f"a page's content is larger than "
        f"{min(limits.max_content_stream_bytes, MAX_STREAM_OUTPUT)} bytes.",
    )


def _too_many_operators(what: str) -> RetrievalError:
    return too_complex(DocumentTooComplexReason.PDF_OPERATORS, f"{what} content-stream operators.")


def _check_contents_object(page: PageObject, number: int) -> None:
    """Refuse a page whose `/Contents` is there but is not content (a stream, or an array of
    streams): pypdf would read it as an empty page, and the document would replace the
    previous revision one page short, with nothing to tell that page from a blank one."""
    reference = page.get("/Contents")
    if reference is None:
        return  # a page without content: blank
    contents = reference.get_object()
    parts = contents if isinstance(contents, ArrayObject) else [contents]
    if isinstance(contents, NullObject) or all(
        isinstance(part.get_object(), StreamObject) for part in parts
    ):
        return
    raise invalid_document(
        InvalidDocumentReason.PDF_MALFORMED, f"the content of page {number} could not be read."
    )


def _page_streams(page: PageObject) -> Iterator[bytes]:
    contents = page.get_contents()
    if contents is not None:
        yield contents.get_data()
    yield from (form.get_data() for form in _forms(page))


def _forms(page: PageObject) -> Iterator[StreamObject]:
    try:
        resources: Any = page.get("/Resources")
        xobjects: Any = resources.get_object().get("/XObject") if resources else None
        items = list(xobjects.get_object().values()) if xobjects else []
    except Exception:  # odd resources: text extraction will judge them
        return
    for item in items:
        xobject = item.get_object()
        if isinstance(xobject, StreamObject) and xobject.get("/Subtype") == "/Form":
            yield xobject


def _raw_streams(page: PageObject) -> Iterator[StreamObject]:
    """The page's content streams (checked by `_check_contents_object`) and form XObjects."""
    contents = page.get("/Contents", NullObject()).get_object()
    for part in contents if isinstance(contents, ArrayObject) else [contents]:
        if isinstance(stream := part.get_object(), StreamObject):
            yield stream
    yield from _forms(page)


def _cut_short(stream: StreamObject) -> bool:
    """A Flate stream whose compressed bytes end before the stream does: pypdf inflates the
    part there silently (probe W, session 35). Other zlib errors (a bad checksum, which pypdf
    accepts) and other filters are pypdf's to judge."""
    filters = stream.get("/Filter", NullObject()).get_object()
    first = filters[0].get_object() if isinstance(filters, ArrayObject) and filters else filters
    if first not in ("/FlateDecode", "/Fl"):
        return False
    inflater = zlib.decompressobj()
    try:  # the raw bytes pypdf keeps; bounded, so a bomb costs nothing
        inflater.decompress(stream._data, max_length=MAX_STREAM_OUTPUT)
    except zlib.error:
        return False
    return not inflater.eof and not inflater.unconsumed_tail


def _count_operators(data: bytes, stop_after: int) -> int:
    count = 0
    for _ in _OPERATOR.finditer(data):
        count += 1
        if count >= stop_after:
            break
    return count


def _encrypted() -> RetrievalError:
    return invalid_document(
        InvalidDocumentReason.PDF_ENCRYPTED, "the PDF is encrypted and needs a password."
    )


def _too_many_pages(limits: IngestLimits, *, declared: bool = False) -> RetrievalError:
    # The declared count is refused unwalked (a tree of millions of entries is not walked to
    # find out), so the detail says what the file claims, not what it holds.
    has = "declares" if declared else "has"
    return too_large(
        PayloadTooLargeReason.PAGES, f"the PDF {has} more than {limits.max_pages} pages."
    )


def _declared_page_count(reader: pypdf.PdfReader) -> int | None:
    """The page tree's own `/Count`, read without walking the tree (it may lie: both count)."""
    try:
        root: Any = reader.trailer["/Root"].get_object()
        count = root["/Pages"].get_object()["/Count"].get_object()
    except Exception:  # a missing or odd /Count is for the tree walk to judge
        return None
    return count if isinstance(count, int) else None


def _info_fields(reader: pypdf.PdfReader) -> dict[str, JSONValue]:
    """The document information a filter can use: `author`, `subject`, `keywords` (text,
    at most 256 characters) and `created` / `modified` (ISO 8601; in UTC, `...Z`, when the
    file gives an offset, so that string comparisons order them: `2024-03-01T23:00:00-05:00`
    sorted before `2024-03-02T01:00:00+00:00`, 3 hours later; as stated when it gives none),
    each only when the file has it and it can be read."""
    fields: dict[str, JSONValue] = {}
    try:
        info = reader.metadata
    except Exception:  # a broken /Info dictionary is no reason to refuse the text
        return fields
    if info is None:
        return fields
    for key, read in (
        ("author", lambda: info.author_raw),
        ("subject", lambda: info.subject_raw),
        ("keywords", lambda: info.keywords_raw),
        ("created", lambda: info.creation_date),
        ("modified", lambda: info.modification_date),
    ):
        try:
            value = read()
        except Exception:  # an unreadable entry (a malformed date, say) is left out
            value = None
        if isinstance(value, datetime):
            if value.tzinfo is None:
                fields[key] = value.isoformat()
                continue
            try:
                in_utc = value.astimezone(UTC)
            except (OverflowError, ValueError):  # year 1 west of UTC, 9999 east: left out
                continue
            fields[key] = in_utc.replace(tzinfo=None).isoformat() + "Z"
        elif (text := _info_text(value)) is not None and clip(text):
            # Only text: pypdf gives bytes it cannot decode as their repr ("b'\\x81...'").
            fields[key] = clip(text, 256)
    return fields


def _info_text(value: object) -> str | None:
    """A document-information string as text. C writers end strings with NUL bytes, and
    pypdf then read `(Pump manual\\000)` as UTF-16 (`'畐灭洠湡慵l'`, a black-box test):
    trailing NULs are dropped before the string is decoded (PDFDocEncoding, or the BOM's)."""
    if isinstance(value, TextStringObject | ByteStringObject):
        raw = value.original_bytes
        stripped = raw.rstrip(b"\x00")
        # Only a PDFDocEncoding string (no byte-order mark): in UTF-16 a character such as
        # U+4E00 ends in a zero byte (a review: "统一" was dropped).
        unmarked = not raw.startswith((codecs.BOM_UTF16_BE, codecs.BOM_UTF16_LE))
        if unmarked and stripped != raw and stripped and b"\x00" not in stripped:
            value = create_string_object(stripped)
    return str(value) if isinstance(value, TextStringObject) else None


def _info_title(reader: pypdf.PdfReader) -> str:
    try:
        info = reader.metadata
        value = _info_text(info.title_raw) if info is not None else None
    except Exception:  # a broken /Info dictionary is no reason to refuse the text
        return ""
    return clip(value, 1024) if isinstance(value, str) else ""

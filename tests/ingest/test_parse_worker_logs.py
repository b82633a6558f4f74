"""What a parse worker logs reaches the host's own logging, never the worker's stderr.

Probe S (session 38): a PDF font's `/Encoding` name holding line feeds (`#0A`) made pypdf log an
error from a worker without any logging configuration; Python's last-resort handler wrote it
raw to stderr, the host's stream of JSON lines, and the file printed a forged JSON line there.
The e2e test `tests/e2e/test_parse_worker_logs.py` reads a real host's stderr; these run the
real pool in-process and look at the records the host side logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import ChunkingSettings, IngestLimits
from retrieval_host.ingest.chunking import Extracted
from retrieval_host.ingest.isolation import CounterRecipe, ParsePool, ParseTask, TokenCounter
from retrieval_host.ingest.worker_logs import MAX_LOG_RECORDS
from tests.support import ingest_documents as docs

FORGED_MESSAGE = "FORGED by an uploaded PDF"
FORGED = (
    '{"time": "2026-12-07T00:00:00.000+00:00", "level": "error", '
    f'"logger": "retrieval_host.http", "message": "{FORGED_MESSAGE}"}}'
)
SECRET = "walrus-ledger-5521"  # document text a parser's exception quotes


def _pdf_name(raw: bytes) -> bytes:
    """`raw` as the characters of a PDF name: `#XX` for delimiters, blanks and line feeds."""
    return b"".join(
        b"#%02X" % c if c < 0x21 or c > 0x7E or bytes([c]) in b"#()<>[]{}/%" else bytes([c])
        for c in raw
    )


def forging_pdf(fonts: int = 1) -> bytes:
    """One page drawing a line in each of `fonts` fonts whose `/Encoding` is a name pypdf does
    not implement: a line feed, a forged JSON log line and a line feed. pypdf reads the page
    (with the standard encoding) and logs the name at error level, once per font."""
    encoding = b"/Weird" + _pdf_name(f"\n{FORGED}\n".encode())
    content = b" ".join(
        b"BT /F%d 12 Tf 72 %d Td (Hello from font %d) Tj ET" % (i, 700 - 14 * i, i)
        for i in range(fonts)
    )
    font_refs = b" ".join(b"/F%d %d 0 R" % (i, 5 + i) for i in range(fonts))
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << %s >> >> >>" % font_refs,
        4: b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    }
    for i in range(fonts):
        objects[5 + i] = (
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding %s%d >>" % (encoding, i)
        )
    return docs.assemble_pdf(objects)


@dataclass(frozen=True)
class FailingRecipe:
    """A counter recipe whose build fails with document text in its message: a parser bug."""

    def build(self) -> TokenCounter:
        try:
            raise KeyError(f"\n{FORGED}\n{SECRET}")
        except KeyError as exc:
            raise ValueError(f"no counter for {SECRET}") from exc


def task(data: bytes, media_type: str, counter: CounterRecipe | None = None) -> ParseTask:
    return ParseTask(
        data, media_type, "s", None, None, None, ChunkingSettings(), IngestLimits(), counter, 60
    )


@pytest.fixture
def pool(caplog: pytest.LogCaptureFixture) -> Iterator[ParsePool]:
    # Before the worker starts: it logs at the host's level, read then.
    caplog.set_level(logging.INFO, logger="retrieval_host")
    p = ParsePool(1)
    yield p
    p.close()


def _worker_records(records: Sequence[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.name.startswith(("retrieval_host.ingest", "pypdf"))]


def test_pypdf_errors_come_back_as_its_template_without_what_it_read(
    pool: ParsePool, caplog: pytest.LogCaptureFixture
) -> None:
    extracted = pool.parse(task(forging_pdf(), "application/pdf"), CancelToken())
    assert isinstance(extracted, Extracted) and "Hello from font 0" in extracted.text
    [record] = _worker_records(caplog.records)
    assert (record.name, record.levelno) == ("retrieval_host.ingest.pdf", logging.ERROR)
    message = record.getMessage()
    assert message.startswith("pypdf._cmap: Advanced encoding %(encoding)s not implemented")
    assert "\n" not in message and "Weird" not in message and FORGED_MESSAGE not in message


def test_a_workers_info_records_reach_the_host(
    pool: ParsePool, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RetrievalError) as refused:
        pool.parse(task(b"%PDF-1.4 this is not a PDF", "application/pdf"), CancelToken())
    assert refused.value.code is ErrorCode.INVALID_DOCUMENT
    messages = [(r.name, r.levelno, r.getMessage()) for r in _worker_records(caplog.records)]
    assert messages == [
        ("retrieval_host.ingest.pdf", logging.INFO, "unreadable PDF: PdfStreamError")
    ]


def test_a_parser_bug_logs_its_frames_and_types_but_not_its_messages(
    pool: ParsePool, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RetrievalError) as failed:
        pool.parse(task(b"# Guide\n", "text/markdown", FailingRecipe()), CancelToken())
    assert failed.value.code is ErrorCode.INTERNAL
    [record] = _worker_records(caplog.records)
    assert (record.name, record.getMessage()) == (
        "retrieval_host.ingest.isolation",
        "parse worker failed",
    )
    error = record.__dict__["fields"]["error"]
    assert error.startswith("Traceback (most recent call last):")
    assert "builtins.KeyError" in error and error.endswith("builtins.ValueError")
    assert "in build" in error  # the frames are there
    assert SECRET not in error and FORGED_MESSAGE not in error


def test_one_document_leaves_at_most_its_share_of_records(
    pool: ParsePool, caplog: pytest.LogCaptureFixture
) -> None:
    fonts = MAX_LOG_RECORDS + 15
    pool.parse(task(forging_pdf(fonts), "application/pdf"), CancelToken())
    records = _worker_records(caplog.records)
    assert len(records) == MAX_LOG_RECORDS + 1
    assert records[-1].getMessage() == "15 more log records of the parse worker were dropped"
    # The next document starts with a full allowance.
    caplog.clear()
    pool.parse(task(forging_pdf(2), "application/pdf"), CancelToken())
    assert len(_worker_records(caplog.records)) == 2

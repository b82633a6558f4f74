"""A running host's stderr stays JSON lines whatever an uploaded document makes its parser log.

Probe S (session 38): a PDF whose font names an `/Encoding` holding line feeds and a forged JSON
log line made pypdf log that name from a parse worker, which had no logging configured:
Python's last-resort handler printed it raw on the host's stderr, two lines of free text and
one forged `{"logger": "retrieval_host.http", ...}` line.
"""

from __future__ import annotations

from pathlib import Path

from tests.ingest.test_parse_worker_logs import FORGED_MESSAGE, forging_pdf
from tests.support.observability import host_process


def test_a_pdf_cannot_write_lines_into_the_hosts_log(tmp_path: Path) -> None:
    with host_process(tmp_path / "host", subjects={"writer": []}) as host:
        with host.client("writer") as writer:
            ingested = writer.post(
                "/v1/retrieval/ingest?corpus=library&sourceId=forging",
                content=forging_pdf(),
                headers={"Content-Type": "application/pdf"},
            )
            assert ingested.status_code == 200, ingested.text
            refused = writer.post(
                "/v1/retrieval/ingest?corpus=library&sourceId=broken",
                content=b"%PDF-1.4 this is not a PDF",
                headers={"Content-Type": "application/pdf"},
            )
            assert refused.status_code == 422, refused.text
        code, _ = host.terminate()
        assert code == 0, host.log_text()[-4000:]

    records = host.log_records()  # fails on any stderr line that is not one JSON object
    text = host.log_text()
    assert FORGED_MESSAGE not in text and "Weird" not in text
    assert all(r["logger"] != "retrieval_host.http" or r["level"] != "error" for r in records)
    worker = [(r["logger"], r["level"], r["message"]) for r in records if "ingest" in r["logger"]]
    # pypdf's error, as its template, and the worker's own info line: both JSON, both logged
    # (the info line was dropped before).
    assert worker == [
        (
            "retrieval_host.ingest.pdf",
            "error",
            "pypdf._cmap: Advanced encoding %(encoding)s not implemented yet, using "
            "%(new_encoding)s instead.",
        ),
        ("retrieval_host.ingest.pdf", "info", "unreadable PDF: PdfStreamError"),
    ]

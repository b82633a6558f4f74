"""Regenerate server/retrieval_host/samples/field-handbook.pdf (needs fpdf2, a test dependency).

The PDF is committed, so running the host never needs fpdf2. Output is deterministic for a
given fpdf2 version: fixed creation date, core fonts only (nothing embedded), one text line per
`cell`, so the line numbers that tests and the quickstart cite do not move.

    python scripts/make_sample_pdf.py [--check]

`--check` exits with status 1 if the committed file differs from a fresh rendering.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from fpdf import FPDF

OUT = Path(__file__).resolve().parents[1] / "server" / "retrieval_host" / "samples"
TARGET = OUT / "field-handbook.pdf"
CREATED = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)

# One entry per page: a heading, then lines ("" is a paragraph break). Kept to ASCII so the
# core Helvetica font renders every character and the text layer reads back exactly.
PAGES: list[tuple[str, list[str]]] = [
    (
        "Backing up the embedded store",
        [
            "The embedded store is a single SQLite file in a private directory, written in",
            "WAL mode. Copying the file while the host runs can capture a half-applied",
            "checkpoint, so never back it up with cp or rsync alone.",
            "",
            "Take a consistent copy with the SQLite online backup API, for example with",
            'sqlite3 store.db ".backup /backups/store-2024-03-01.db", or stop the host',
            "first and copy the database together with its -wal file.",
            "",
            "To restore, stop the host, move the damaged file and its -wal and -shm",
            "sidecars aside, put the backup in place with mode 0600 and start the host.",
            "The host refuses a file that is group-writable or owned by another user.",
            "",
            "A backup is a convenience, not the source of truth: every corpus can be",
            "rebuilt from the application's documents by ingesting them again.",
        ],
    ),
    (
        "Capacity planning",
        [
            "Each passage of the local model costs 384 float32 values, 1.5 KiB of",
            "vector data, plus its text and location. One million passages need about",
            "1.5 GiB of memory for vectors, which the host keeps loaded for searching.",
            "",
            "Limits protect the host from a single huge source: at most 10,000",
            "passages per source and 16 KiB of text per passage by default. A corpus",
            "stops accepting writes when its payload reaches the configured ceiling.",
            "",
            "When one machine is no longer enough, move the corpus to PostgreSQL with",
            "pgvector. Several host replicas can then share one database.",
        ],
    ),
    (
        "Upgrading the embedding model",
        [
            "A corpus records the exact embedding model, its dimensions and the chunking",
            "settings. A host configured with a different model refuses to open the old",
            "corpus with DESCRIPTOR_MISMATCH, before it spends any embedding request.",
            "",
            "Plan an upgrade as a migration: create a corpus with a new index version,",
            "ingest all documents into it, compare search quality on saved queries,",
            "switch the application, then delete the old corpus.",
        ],
    ),
    (
        "Monitoring and alerts",
        [
            "Scrape the Prometheus metrics endpoint with its own metrics token. Alert on",
            "a rising rate of HOST_BUSY responses, which means requests are waiting for",
            "the concurrency limit, and on EMBEDDING_FAILED, which is never retried.",
            "",
            "Readiness turns false while stores are closed or the model is not loaded;",
            "keep the load balancer on the readiness probe, not on liveness.",
        ],
    ),
]


def render() -> bytes:
    """The handbook as PDF bytes (deterministic for one fpdf2 version)."""
    pdf = FPDF(format="A4")
    pdf.set_creation_date(CREATED)
    pdf.set_title("Retrieval host field handbook")
    pdf.set_author("retrieval-host samples")
    pdf.set_auto_page_break(auto=False)
    for heading, lines in PAGES:
        pdf.add_page()
        pdf.set_font("Helvetica", style="B", size=16)
        pdf.cell(0, 12, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        for line in lines:
            pdf.cell(0, 7 if line else 4, line, new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    data = render()
    if args.check:
        same = TARGET.exists() and TARGET.read_bytes() == data
        print("up to date" if same else f"{TARGET} differs from a fresh rendering")
        return 0 if same else 1
    TARGET.write_bytes(data)
    print(f"wrote {TARGET} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hostile files: each refused by the limit checked before the costly step, within 512 MiB.

The child (`tests.support.ingest_child`) loads the real model and store and starts its parse
workers, then caps its address space at current use + 512 MiB and arms an alarm whose default
action kills it (a hang guard), and only then ingests. A regression therefore shows up as a
killed child or a wrong answer here, never as a hung or swapping test suite. The answer's
reason is what shows the work stayed bounded (a page count refused before any extraction), not
a wall-clock figure, which a loaded machine stretches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import ingest_documents as docs

REPO = Path(__file__).resolve().parents[2]

PDF, EML, MBOX, MD = "application/pdf", "message/rfc822", "application/mbox", "text/markdown"
TOO_LARGE, INVALID = "PAYLOAD_TOO_LARGE", "INVALID_DOCUMENT"

CASES: list[tuple[str, Callable[[], bytes], str, str, str | None]] = [
    ("flate-bomb", docs.flate_bomb_pdf, PDF, "DOCUMENT_TOO_COMPLEX", "pdf-content-stream"),
    ("circular-xref", docs.circular_xref_pdf, PDF, INVALID, "pdf-malformed"),
    ("cyclic-page-tree", docs.cyclic_page_tree_pdf, PDF, INVALID, "pdf-malformed"),
    # A one-page file was refused as "more than 2000 pages" (a black-box report).
    ("page-tree-1000-deep", lambda: docs.deep_page_tree_pdf(1000), PDF, INVALID, "pdf-malformed"),
    ("array-1000-deep", lambda: docs.deep_array_pdf(1000), PDF, INVALID, "pdf-malformed"),
    ("10000-pages", lambda: docs.many_pages_pdf(10_000), PDF, TOO_LARGE, "pages"),
    ("10000-pages-count-lies", lambda: docs.many_pages_pdf(10_000, declared=1), PDF, TOO_LARGE,
     "pages"),
    ("10000-mime-parts", lambda: docs.many_parts_message(10_000), EML, TOO_LARGE, "mime-parts"),
    ("nested-100-deep", lambda: docs.nested_message(100), EML, TOO_LARGE, "mime-depth"),
    ("1mb-header-line", lambda: docs.long_header_message(1 << 20), EML, TOO_LARGE,
     "header-bytes"),
    ("5001-message-mbox", lambda: docs.mbox(*[docs.message(f"m{i}\n") for i in range(5001)]),
     MBOX, TOO_LARGE, "messages"),
    ("empty-file", lambda: b"", PDF, INVALID, "empty-document"),
    ("markdown-claimed-as-pdf", lambda: b"# Guide\n\nText.\n", PDF, INVALID,
     "content-type-mismatch"),
    ("pdf-claimed-as-markdown", docs.one_page_pdf, MD, INVALID, "content-type-mismatch"),
    ("pdf-claimed-as-mbox", docs.one_page_pdf, MBOX, INVALID, "content-type-mismatch"),
    ("pdf-claimed-as-eml", docs.one_page_pdf, EML, INVALID, "content-type-mismatch"),
    ("unknown-type", lambda: b"a,b\n1,2\n", "text/csv", "UNSUPPORTED_MEDIA_TYPE",
     "unsupported-media-type"),
]  # fmt: skip


def run_child(tmp_path: Path, data: bytes, media_type: str) -> dict[str, Any]:
    source = tmp_path / "input.bin"
    source.write_bytes(data)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.ingest_child",
            str(source),
            media_type,
            str(tmp_path / "store" / "index.db"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # start-up (model load) included; the ingest has its own hang guard
        check=False,
    )
    assert completed.returncode == 0, (
        f"child died (signal {-completed.returncode} if negative): {completed.stderr[-2000:]}"
    )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "media_type", "code", "reason"),
    [pytest.param(make, mt, code, reason, id=name) for name, make, mt, code, reason in CASES],
)
def test_a_hostile_file_is_refused_quickly_within_memory_and_indexes_nothing(
    tmp_path: Path, make: Callable[[], bytes], media_type: str, code: str, reason: str | None
) -> None:
    data = make()
    assert len(data) < 2 * 1024 * 1024  # small inputs: the damage would be in the parsing
    outcome = run_child(tmp_path, data, media_type)
    assert (outcome.get("code"), outcome.get("reason")) == (code, reason)
    assert outcome["indexed"] is False


@pytest.mark.slow
def test_broken_charsets_are_indexed_with_replacement_not_a_crash(tmp_path: Path) -> None:
    outcome = run_child(tmp_path, docs.broken_charsets_message(), EML)
    assert outcome.get("status") == "indexed", outcome
    assert outcome["seconds"] < 5
    assert outcome["indexed"] is True

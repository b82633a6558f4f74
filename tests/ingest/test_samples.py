"""The shipped sample documents: small, ingestible, and distinct enough to search."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pypdf
import pytest

import retrieval_host.driver
from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.models import SearchRequest
from retrieval_host.driver import IngestRequest
from retrieval_host.ingest import media_type_for_path
from tests.support.ingest_driver import CORPUS, Host, context, make_host

# Beside the package's modules (retrieval_host is a namespace package: no resource reader).
SAMPLES = Path(retrieval_host.driver.__file__).with_name("samples")
REPO = Path(__file__).resolve().parents[2]


def sample_files() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if p.is_file())


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_sample_pdf", REPO / "scripts" / "make_sample_pdf.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_three_samples_exist_and_are_small() -> None:
    assert [p.name for p in sample_files()] == [
        "field-handbook.pdf",
        "operator-guide.md",
        "reindex-thread.mbox",
    ]
    assert all(p.stat().st_size < 50_000 for p in sample_files())


def test_the_committed_pdf_has_the_text_its_script_writes() -> None:
    script = load_script()
    reader = pypdf.PdfReader(SAMPLES / "field-handbook.pdf")
    assert len(reader.pages) == len(script.PAGES) >= 3
    for page, (heading, lines) in zip(reader.pages, script.PAGES, strict=True):
        assert page.extract_text().split("\n") == [heading, *(line for line in lines if line)]
    assert script.render()[:8] == b"%PDF-1.3"  # the script still renders with fpdf2


@pytest.fixture(scope="module")
def sample_host(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[Host]:
    """All three samples ingested once for this module's searches."""
    host = make_host(tmp_path_factory.mktemp("samples") / "store" / "index.db", local_embedding)
    for path in sample_files():
        result = host.driver.ingest_context(
            IngestRequest(CORPUS, path.name, media_type_for_path(path), path.read_bytes()),
            context(),
        )
        assert result.status == "indexed"
        host.library.readable[path.name] = result.source.revision
    yield host
    host.store.close()


@pytest.mark.parametrize(
    ("query", "source_id", "expected"),
    [
        ("how do I rotate a token", "operator-guide.md", "### Rotating a token"),
        ("how do I restore the store from a backup", "field-handbook.pdf", "Backing up"),
        ("why does the nightly import re-embed every article", "reindex-thread.mbox", "footer"),
    ],
)
def test_a_question_finds_the_passage_that_answers_it(
    sample_host: Host, query: str, source_id: str, expected: str
) -> None:
    hit = sample_host.driver.search_context(SearchRequest(CORPUS, query, limit=1), context()).hits[
        0
    ]
    assert hit.source.id == source_id
    assert expected in hit.text


def test_sample_locations_point_into_the_files(sample_host: Host) -> None:
    rotate = sample_host.driver.search_context(
        SearchRequest(CORPUS, "how do I rotate a token", limit=1), context()
    ).hits[0]
    lines = (SAMPLES / "operator-guide.md").read_text().split("\n")
    start, end = rotate.location.start_line, rotate.location.end_line
    assert start is not None and end is not None
    assert rotate.text == "\n".join(lines[start - 1 : end])
    backup = sample_host.driver.search_context(
        SearchRequest(CORPUS, "restore a backup of the SQLite file", limit=1), context()
    ).hits[0]
    assert backup.location.page == 1
    thread = sample_host.driver.search_context(
        SearchRequest(CORPUS, "footer gives every article a new revision", limit=1), context()
    ).hits[0]
    assert thread.location.document_id == "<import-latency-2@example.com>"
    # An HTML-only message is cited by the lines of its HTML body: each passage line is the
    # text of the body line it cites, without its tags and scripts (white space aside).
    runbook = sample_host.driver.search_context(
        SearchRequest(CORPUS, "boilerplate belongs in templates runbook", limit=1), context()
    ).hits[0]
    assert runbook.location.document_id == "<import-latency-4@example.com>"
    raw = (SAMPLES / "reindex-thread.mbox").read_text().split("\n")
    body = raw[raw.index("Message-ID: <import-latency-4@example.com>") :]
    body = body[body.index("") + 1 :]
    start = runbook.location.start_line
    assert start == 2  # line 1 is the <head> and its style: no visible text
    for number, line in enumerate(runbook.text.split("\n"), start):
        visible = re.sub(r"<script>.*</script>|<[^>]*>|\s", "", body[number - 1])
        assert line.replace(" ", "") == visible, number

"""A hit (and a passage read by its chunk id) narrows `sections` to `section` and `messages` to
`message` by the media type the store recorded for its source revision, over every store.

Probe H (session 40): the decision was made from the metadata's own `mediaType` key, which an
upload's caller metadata overrides key by key: `{"mediaType": "text/plain"}` on a Markdown
upload gave every hit the whole `sections` list again, and a prepared source whose own
metadata held `mediaType: "text/markdown"` and a list of ingestion's shape was narrowed. A
prepared source whose `mediaType` was a list made every search over it fail (an unhashable
type). Each test reads through a second store over the same database too: for SQLite that is
the in-memory index loaded from the tables, not the one the write built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.sqlite.snapshot import snapshot_path
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import (
    ChunkInput,
    Hit,
    IndexRequest,
    JSONScalar,
    JSONValue,
    Location,
    SearchMode,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant, VectorStore
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.ingest import ChunkingSettings
from tests.contract.conftest import StoreHarness

CORPUS = "docs"
MODES: tuple[SearchMode, ...] = ("dense", "lexical", "hybrid")
QUERY = "valve fuel pump"
GUIDE = b"""# Guide

Read this guide before the first start of the pump.

## Fuel

Close the fuel valve before the pump is serviced, and open it slowly afterwards.
"""
SECTIONS: list[JSONValue] = [
    {"headings": ["Guide"], "startLine": 1, "endLine": 4},
    {"headings": ["Guide", "Fuel"], "startLine": 5, "endLine": 8},
]
MESSAGES: list[JSONValue] = [
    {"messageId": "<a@x>", "from": "Ada", "date": "d", "subject": "s", "attachments": []},
]


def _mail() -> bytes:
    message = EmailMessage()
    message["From"] = "Ada <ada@example.org>"
    message["To"] = "ops@example.org"
    message["Subject"] = "Fuel valve"
    message["Message-ID"] = "<valve-1@example.org>"
    message["Date"] = "Mon, 01 Jun 2026 09:00:00 +0000"
    message.set_content("Close the fuel valve before the pump is serviced.\n")
    return message.as_bytes()


@dataclass
class _Library:
    """Any source may be indexed; searches see the revisions in `readable`."""

    readable: dict[str, str] = field(default_factory=dict)

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        if request.operation == "index":
            return Grant("ns", {sid: ANY_REVISION for sid in request.source_ids or ()})
        return Grant("ns", dict(self.readable))


def _driver(store: VectorStore, embedding: LocalEmbedding, library: _Library) -> Driver:
    identity = ChunkingSettings().as_identity()
    return Driver(
        RetrievalService([Corpus(CORPUS, "v1", embedding, store, library, chunking=identity)])
    )


def _upload(
    driver: Driver,
    library: _Library,
    source_id: str,
    media_type: str,
    data: bytes,
    metadata: Mapping[str, JSONScalar],
) -> None:
    result = driver.ingest_context(
        IngestRequest(CORPUS, source_id, media_type, data, metadata=metadata),
        RequestContext("writer"),
    )
    library.readable[source_id] = result.source.revision


def _readers(
    harness: StoreHarness, embedding: LocalEmbedding, library: _Library, written: Driver
) -> Iterator[Driver]:
    """The driver that wrote, then one over a store opened afterwards on the same database."""
    yield written
    yield _driver(harness.open(), embedding, library)


def _shown(driver: Driver, hits: list[Hit]) -> Iterator[tuple[Hit, Mapping[str, JSONValue]]]:
    """Each hit with what a read of its chunk id shows (the same metadata, by contract)."""
    for hit in hits:
        passage = driver.get_passage(CORPUS, hit.chunk_id, RequestContext("reader"))
        yield hit, passage.metadata


def _hits(driver: Driver, mode: SearchMode) -> list[Hit]:
    request = SearchRequest(CORPUS, QUERY, limit=20, mode=mode)
    hits = list(driver.search_context(request, RequestContext("reader")).hits)
    assert hits, mode
    return hits


def test_an_upload_whose_metadata_names_another_type_still_shows_its_own_section(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    library = _Library()
    writer = _driver(harness.open(), local_embedding, library)
    _upload(writer, library, "guide", "text/markdown", GUIDE, {"mediaType": "text/plain"})
    for reader in _readers(harness, local_embedding, library, writer):
        for mode in MODES:
            for hit, read in _shown(reader, _hits(reader, mode)):
                assert "sections" not in hit.metadata, mode
                assert hit.metadata["mediaType"] == "text/plain"  # the caller's, still shown
                section = hit.metadata["section"]
                assert isinstance(section, dict)
                expected = ["Guide", "Fuel"] if "fuel valve" in hit.text else ["Guide"]
                assert section["headings"] == expected
                assert read == hit.metadata
    # The source keeps the whole list; its recorded type is the document's.
    detail = writer.get_source(CORPUS, "guide", RequestContext("reader"))
    assert detail.source.media_type == "text/markdown"
    listed = detail.source.metadata["sections"]
    assert isinstance(listed, list) and len(listed) == 2


def test_an_e_mail_upload_whose_metadata_names_another_type_still_shows_its_message(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    library = _Library()
    writer = _driver(harness.open(), local_embedding, library)
    _upload(writer, library, "mail", "message/rfc822", _mail(), {"mediaType": "text/plain"})
    for reader in _readers(harness, local_embedding, library, writer):
        for mode in MODES:
            for hit, read in _shown(reader, _hits(reader, mode)):
                assert "messages" not in hit.metadata, mode
                assert hit.metadata["mediaType"] == "text/plain"
                message = hit.metadata["message"]
                assert isinstance(message, dict)
                assert message["messageId"] == "<valve-1@example.org>"
                assert read == hit.metadata


# Prepared passages' own metadata, shaped like what ingestion writes: never narrowed.
LOOKALIKES: dict[str, dict[str, JSONValue]] = {
    "markdown-lookalike": {"mediaType": "text/markdown", "sections": SECTIONS},
    "mail-lookalike": {"mediaType": "message/rfc822", "messages": MESSAGES},
}


def _index_prepared(
    driver: Driver, library: _Library, sources: Mapping[str, Mapping[str, JSONValue]]
) -> None:
    for source_id, metadata in sources.items():
        driver.retrieval.index_context(
            IndexRequest(
                CORPUS,
                SourceInfo(source_id, "r1", title=source_id, metadata=metadata),
                # Where a narrowing would find an entry: line 6, the first message's id.
                [
                    ChunkInput(
                        f"{source_id}:0",
                        "Close the fuel valve before the pump is serviced.",
                        Location(start_line=6, end_line=6, document_id="<a@x>"),
                    )
                ],
            ),
            RequestContext("writer"),
        )
        library.readable[source_id] = "r1"


def _assert_shown_as_indexed(
    harness: StoreHarness,
    embedding: LocalEmbedding,
    sources: Mapping[str, Mapping[str, JSONValue]],
) -> None:
    library = _Library()
    writer = _driver(harness.open(), embedding, library)
    _index_prepared(writer, library, sources)
    for reader in _readers(harness, embedding, library, writer):
        for mode in MODES:
            hits = _hits(reader, mode)
            assert {h.source.id for h in hits} == set(sources), mode
            for hit, read in _shown(reader, hits):
                assert hit.metadata == sources[hit.source.id], mode
                assert read == hit.metadata


def test_prepared_passages_with_look_alike_metadata_are_shown_as_indexed(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    _assert_shown_as_indexed(harness, local_embedding, LOOKALIKES)


def test_a_prepared_source_whose_media_type_key_is_a_list_is_searched_and_shown(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    # The metadata's `mediaType` was looked up in a set of types: a list failed every search
    # and passage read over the source (unhashable), whatever else it held.
    listed: dict[str, JSONValue] = {"mediaType": ["text/markdown"], "sections": SECTIONS}
    _assert_shown_as_indexed(harness, local_embedding, {"listed-type": listed})


def test_a_store_that_maps_its_index_snapshot_still_narrows_hits(
    tmp_path: Path, local_embedding: LocalEmbedding, caplog: pytest.LogCaptureFixture
) -> None:
    # The snapshot file holds no metadata and no media type: an open reads both from SQLite
    # with the sources it keeps, so a snapshot written before the media type was carried
    # (the same format) serves narrowed hits too.
    tmp_path.chmod(0o700)  # a snapshot is only mapped from a private directory
    db = tmp_path / "store.db"
    library = _Library()
    store = SqliteVectorStore.open(db)
    writer = _driver(store, local_embedding, library)
    _upload(writer, library, "guide", "text/markdown", GUIDE, {"mediaType": "text/plain"})
    store.close()  # writes the snapshot (something changed)
    assert snapshot_path(db, CORPUS).exists()
    mapped = SqliteVectorStore.open(db)
    try:
        with caplog.at_level(logging.INFO, logger="retrieval_host.adapters.sqlite"):
            reader = _driver(mapped, local_embedding, library)
            hits = _hits(reader, "dense")
        assert "mapped the index snapshot" in caplog.text
        for hit in hits:
            assert "sections" not in hit.metadata
            assert isinstance(hit.metadata["section"], dict)
            assert hit.metadata["mediaType"] == "text/plain"
    finally:
        mapped.close()

"""The SQLite vector store's migration from schema 4 to 5 gives a source without a media type
the one its metadata names only when ingestion wrote it: every passage id is the id ingestion
derives for that passage (source id, revision, position, text).

Probe U (session 42): a prepared source an earlier release accepted with ids of ingestion's
shape ("p" and 24 hex digits; a copy of an ingested source made through the index API has
them) was typed `text/markdown` by the upgrade, listed under `?mediaType=text/markdown`, and
its hits' metadata narrowed. The cases and the builders are shared with the PostgreSQL test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import apsw
import numpy as np
import pytest

from retrieval_host.adapters import _media_type_backfill
from retrieval_host.adapters._media_type_backfill import Candidate, Passage
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.sqlite.tables import SCHEMA_VERSION
from retrieval_host.core.inspection import SourceFilter
from retrieval_host.core.models import JSONValue
from retrieval_host.core.ports import CapacityLimits, VectorStore
from retrieval_host.core.validation import derived_chunk_id
from tests.support.sqlite_store import descriptor, revision, unit_vectors

TEXTS = (
    "Glacier crampons are checked before every ascent.",
    "Ice axes hang on the left wall of the gear room.",
)
LONG = tuple(f"Rope {n} is retired after ten falls." for n in range(5))
METADATA: Mapping[str, JSONValue] = {
    "mediaType": "text/markdown",
    "sections": [
        {"headings": ["Copied"], "startLine": 1, "endLine": 2},
        {"headings": ["Copied", "Two"], "startLine": 3, "endLine": 4},
    ],
}


def derived(source_id: str, rev: str = "r1", texts: Sequence[str] = TEXTS) -> list[str]:
    return [derived_chunk_id(source_id, rev, i, t) for i, t in enumerate(texts)]


@dataclass(frozen=True)
class Case:
    namespace: str
    source_id: str
    chunk_ids: Sequence[str]
    expected: str | None  # the media type after the migration
    texts: Sequence[str] = TEXTS


CASES = (
    # Ingested by an earlier release: the type its metadata names.
    Case("ns", "guide", derived("guide"), "text/markdown"),
    Case("ns", "ropes", derived("ropes", texts=LONG), "text/markdown", LONG),
    # The probe's prepared source: ids of ingestion's shape that are nobody's digest.
    Case("ns", "copy-1", ["p0123456789abcdef01234567", "p89abcdef0123456789abcdef"], None),
    # A copy of `guide` with its very ids, under another source id (another namespace: ids
    # are unique per namespace).
    Case("other", "guide-copy", derived("guide"), None),
    # Each input of the digest counts: the revision, the position, every passage.
    Case("ns", "old-revision", derived("old-revision", "r0"), None),
    Case("ns", "swapped", derived("swapped")[::-1], None),
    Case("ns", "half", [derived("half")[0], "p" + "0" * 24], None),
    Case("ns", "zz-ingested", derived("zz-ingested"), "text/markdown"),
)
NAMESPACES = sorted({c.namespace for c in CASES})


def write_cases(store: VectorStore) -> None:
    """The cases as the previous schema holds them: no media type recorded."""
    store.open_corpus(descriptor("c1"))
    for n, case in enumerate(CASES):
        source, chunks = revision(
            case.source_id,
            "r1",
            unit_vectors(np.random.default_rng(n), len(case.texts)),
            metadata=METADATA,
            texts=case.texts,
            chunk_ids=case.chunk_ids,
        )
        store.replace_source(
            "c1",
            case.namespace,
            replace(source, media_type=None),
            chunks,
            expected_revision=None,
            limits=CapacityLimits(),
        )


def listed_types(store: VectorStore) -> dict[tuple[str, str], str | None]:
    store.open_corpus(descriptor("c1"))
    found: dict[tuple[str, str], str | None] = {}
    for namespace in NAMESPACES:
        allowed = {c.source_id: "r1" for c in CASES if c.namespace == namespace}
        for s in store.list_sources("c1", namespace, allowed, after=None, limit=100):
            assert dict(s.metadata) == METADATA  # the metadata itself is untouched
            found[(namespace, s.id)] = s.media_type
    return found


EXPECTED = {(c.namespace, c.source_id): c.expected for c in CASES}


def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 2 sources, batches of 3 passages: every window and batch edge is crossed, and
    `ropes` (5 passages) is a batch of its own."""
    monkeypatch.setattr(_media_type_backfill, "SOURCES_PER_WINDOW", 2)
    monkeypatch.setattr(_media_type_backfill, "PASSAGES_PER_BATCH", 3)


def fail_on_batch(monkeypatch: pytest.MonkeyPatch, failing: int) -> Callable[[], int]:
    """`ingested` raises on its `failing`-th batch (after earlier batches were recorded);
    returns how many batches it was asked for."""
    calls = [0]
    real = _media_type_backfill.ingested

    def ingested(batch: Sequence[Candidate], rows: Iterable[Passage]) -> list[tuple[str, int]]:
        calls[0] += 1
        if calls[0] == failing:
            raise RuntimeError("the migration stops here")
        return real(batch, rows)

    monkeypatch.setattr(_media_type_backfill, "ingested", ingested)
    return lambda: calls[0]


def _raw(path: Path) -> tuple[int, dict[tuple[str, str], str | None]]:
    db = apsw.Connection(str(path))
    try:
        version = int(str(db.execute("PRAGMA user_version").fetchall()[0][0]))
        rows = db.execute("SELECT namespace, source_id, media_type FROM sources").fetchall()
        return version, {(str(r[0]), str(r[1])): None if r[2] is None else str(r[2]) for r in rows}
    finally:
        db.close()


def _previous_store(tmp_path: Path) -> Path:
    """A store of schema version 4, the previous main's: its tables are this release's (the
    new version changes data only), with no media type recorded."""
    tmp_path.chmod(0o700)
    path = tmp_path / "store.db"
    with SqliteVectorStore.open(path) as store:
        write_cases(store)
    db = apsw.Connection(str(path))
    try:
        db.execute("PRAGMA user_version=4")
    finally:
        db.close()
    assert _raw(path) == (4, dict.fromkeys(EXPECTED))
    return path


def test_only_sources_whose_every_passage_id_is_ingestions_own_get_a_media_type(
    tmp_path: Path,
) -> None:
    path = _previous_store(tmp_path)
    with SqliteVectorStore.open(path) as store:
        assert listed_types(store) == EXPECTED
        markdown = SourceFilter(media_type="text/markdown")
        listed = store.list_sources(
            "c1", "ns", {c.source_id: "r1" for c in CASES}, after=None, limit=100
        )
        assert [s.id for s in listed if markdown.keeps(s)] == ["guide", "ropes", "zz-ingested"]
    assert _raw(path) == (SCHEMA_VERSION, EXPECTED)
    with SqliteVectorStore.open(path) as store:  # opening it again changes nothing
        assert listed_types(store) == EXPECTED


def test_the_backfill_decides_alike_across_pages_and_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _previous_store(tmp_path)
    small_batches(monkeypatch)
    with SqliteVectorStore.open(path) as store:
        assert listed_types(store) == EXPECTED
    assert _raw(path) == (SCHEMA_VERSION, EXPECTED)


def test_a_backfill_that_fails_midway_leaves_the_store_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _previous_store(tmp_path)
    small_batches(monkeypatch)
    batches = fail_on_batch(monkeypatch, failing=3)  # two batches recorded a type by then
    with pytest.raises(RuntimeError, match="the migration stops here"):
        SqliteVectorStore.open(path)
    assert batches() == 3
    assert _raw(path) == (4, dict.fromkeys(EXPECTED))  # one transaction: nothing was kept
    monkeypatch.undo()
    with SqliteVectorStore.open(path) as store:
        assert listed_types(store) == EXPECTED

"""The SQLite store's in-memory index: replacements, compaction and input validation."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from retrieval_host.adapters._store_rules import StoreCounters
from retrieval_host.adapters.sqlite import SqliteVectorStore, segment
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import CapacityLimits, StoredChunk
from tests.support.sqlite_store import DIM, descriptor, revision, revision_text, unit_vectors

LIMITS = CapacityLimits()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteVectorStore]:
    with SqliteVectorStore.open(tmp_path / "store.db", scan_batch_rows=16) as s:
        s.open_corpus(descriptor("c1"))
        yield s


def test_many_replacements_keep_exactly_the_current_revisions(
    store: SqliteVectorStore, tmp_path: Path
) -> None:
    # Hundreds of replacements grow, fill and compact the in-memory matrix several times.
    rng = np.random.default_rng(5)
    current: dict[str, tuple[str, int]] = {}
    for step in range(300):
        source_id = f"s{step % 7}"
        count = 1 + (step * 13) % 40
        previous = current.get(source_id, (None, 0))[0]
        source, chunks = revision(source_id, f"r{step}", unit_vectors(rng, count))
        store.replace_source("c1", "ns", source, chunks, expected_revision=previous, limits=LIMITS)
        current[source_id] = (f"r{step}", count)
        if step % 50 == 49:
            victim = f"s{step % 5}"
            store.delete_source("c1", "ns", victim, current.pop(victim)[0])

    allowed = {sid: rev for sid, (rev, _) in current.items()}
    query = unit_vectors(rng, 1)[0]
    hits = store.search("c1", "ns", allowed, query, 10_000, CancelToken())
    expected = sorted(
        revision_text(sid, rev, i, n) for sid, (rev, n) in current.items() for i in range(n)
    )
    assert sorted(h.text for h in hits) == expected
    # Passages found by their row (and lexicon slot) after the compactions: a named passage
    # scores what the searches gave it.
    named = store.dense_scores("c1", "ns", hits, query, CancelToken())
    assert None not in named
    np.testing.assert_allclose(np.array(named), np.array([h.score for h in hits]), atol=1e-6)
    terms = query_terms(hits[0].text, DEFAULT_ANALYZER)
    ranked = store.lexical_search("c1", "ns", allowed, terms, 10_000, CancelToken())
    assert ranked
    by_id = {h.chunk_id: h.score for h in ranked}
    lexical = store.lexical_scores("c1", "ns", allowed, hits, terms, CancelToken())
    assert lexical == [by_id.get(h.chunk_id, 0.0) for h in hits]

    # A fresh store reading the same file agrees.
    with SqliteVectorStore.open(tmp_path / "store.db") as fresh:
        fresh.open_corpus(descriptor("c1"))
        again = fresh.search("c1", "ns", allowed, query, 10_000, CancelToken())
    assert [(h.chunk_id, h.revision) for h in again] == [(h.chunk_id, h.revision) for h in hits]
    np.testing.assert_allclose([h.score for h in again], [h.score for h in hits], atol=1e-6)


def test_the_callers_vectors_are_never_modified(store: SqliteVectorStore) -> None:
    rng = np.random.default_rng(1)
    big = rng.standard_normal((6, DIM * 2)) * 7.0  # float64, not normalised
    vectors = big[:, ::2]  # a strided view: not contiguous
    original = big.copy()
    source, chunks = revision("a", "r1", vectors)  # type: ignore[arg-type]
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    query = vectors[3]
    hits = store.search("c1", "ns", {"a": "r1"}, query, 2, CancelToken())
    assert hits[0].chunk_id == "a:3"
    assert hits[0].score == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_array_equal(big, original)


@pytest.mark.parametrize(
    "vector",
    [np.ones(DIM + 1, np.float32), np.zeros(DIM, np.float32), np.full(DIM, np.nan, np.float32)],
    ids=["wrong-dimensions", "zero", "nan"],
)
def test_an_unusable_passage_vector_is_refused_and_nothing_changes(
    store: SqliteVectorStore, vector: np.typing.NDArray[np.float32]
) -> None:
    v = unit_vectors(np.random.default_rng(2), 2)
    source, chunks = revision("a", "r1", v)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    bad_source, bad_chunks = revision("a", "r2", v)
    bad_chunks[1] = StoredChunk("a:1", 1, "text", bad_chunks[1].location, vector)
    with pytest.raises(RetrievalError) as excinfo:
        store.replace_source(
            "c1", "ns", bad_source, bad_chunks, expected_revision="r1", limits=LIMITS
        )
    assert excinfo.value.code is ErrorCode.INVALID_REQUEST
    assert store.get_source("c1", "ns", "a") == source


def test_a_chunk_count_that_disagrees_with_the_chunks_is_refused(
    store: SqliteVectorStore,
) -> None:
    source, chunks = revision("a", "r1", unit_vectors(np.random.default_rng(3), 3))
    with pytest.raises(RetrievalError) as excinfo:
        store.replace_source("c1", "ns", source, chunks[:2], expected_revision=None, limits=LIMITS)
    assert excinfo.value.code is ErrorCode.INVALID_REQUEST
    assert store.get_source("c1", "ns", "a") is None


def test_counters_are_snapshots(store: SqliteVectorStore) -> None:
    v = unit_vectors(np.random.default_rng(4), 40)
    source, chunks = revision("a", "r1", v)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    before = store.counters
    store.search("c1", "ns", {"a": "r1"}, v[0], 3, CancelToken())
    assert before == StoreCounters()
    assert store.counters == StoreCounters(
        scans_started=1, scan_batches=3, scans_cancelled=0, rows_scored=40
    )


def test_passages_are_found_by_their_chunk_id_when_every_hash_collides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A passage's row is found by its chunk id's hash and checked against the id itself:
    with one hash for every chunk, each passage still gets its own score (and a chunk id the
    store does not hold, none)."""
    monkeypatch.setattr(segment, "chunk_hash", lambda chunk_id: 7)
    rng = np.random.default_rng(3)
    with SqliteVectorStore.open(tmp_path / "store.db") as store:
        store.open_corpus(descriptor("c1"))
        source, chunks = revision("s1", "r1", unit_vectors(rng, 5))
        store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
        query = unit_vectors(rng, 1)[0]
        hits = store.search("c1", "ns", {"s1": "r1"}, query, 5, CancelToken())
        assert len(hits) == 5
        shuffled = [hits[i] for i in (3, 0, 4, 1, 2)]
        ghost = replace(hits[0], chunk_id="not-held")
        scores = store.dense_scores("c1", "ns", [*shuffled, ghost], query, CancelToken())
        assert scores == [h.score for h in shuffled] + [None]

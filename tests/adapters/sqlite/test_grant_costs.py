"""What a large grant costs the SQLite store's inspection reads and filtered searches (probe
Q, session 41): neither may grow with the grant times the namespace, nor repeat a filter's
evaluation within one search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore, segment
from retrieval_host.adapters.sqlite import inspect as sqlite_inspect
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.filters import parse_filter
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, unit_vectors

DIM = 4


def _store(tmp_path: Path, sources: int) -> tuple[SqliteVectorStore, dict[str, str]]:
    store = SqliteVectorStore.open(tmp_path / "store.db")
    store.open_corpus(descriptor("c1", dimensions=DIM))
    rng = np.random.default_rng(7)
    allowed = {}
    for i in range(sources):
        source, chunks = revision(
            f"s{i:03d}", "r1", unit_vectors(rng, 1, DIM), metadata={"n": i}, texts=["alpha beta"]
        )
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
        allowed[f"s{i:03d}"] = "r1"
    return store, allowed


def test_the_grant_drives_the_inspection_join(tmp_path: Path) -> None:
    """The plan's outer loop is the grant, each source found by the unique index: SQLite
    chose the namespace's sources outside and scanned the whole grant JSON for each (11 s of
    CPU per `GET /v1/corpora` with 10,000 sources granted of 10,000)."""
    store, allowed = _store(tmp_path, 40)
    try:
        conn = store._conn  # the store's own connection: its schema and indexes
        assert conn is not None
        plan = [
            str(row[3])
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT s.source_id {sqlite_inspect._GRANTED}",
                (json.dumps(allowed), "c1", "ns"),
            ).fetchall()
        ]
        assert plan[0].startswith("SCAN g VIRTUAL TABLE"), plan
        assert plan[1].startswith("SEARCH s USING INDEX"), plan
        listed = store.list_sources("c1", "ns", allowed, after=None, limit=100)
        assert [s.id for s in listed] == sorted(allowed)  # still in id order
        assert store.source_totals("c1", "ns", allowed).sources == 40
    finally:
        store.close()


def test_a_filtered_hybrid_read_evaluates_the_filter_once_per_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dense search, lexical search and the lexical completion of one read each evaluated the
    filter over every allowed source: a filter of 256 conditions over 10,000 sources cost
    13.5 s of CPU per hybrid search, under the store's cache lock."""
    store, allowed = _store(tmp_path, 30)
    evaluated: list[object] = []
    real = segment.matches  # type: ignore[attr-defined]

    def counted(tree: object, metadata: object) -> bool:
        evaluated.append(metadata)
        return real(tree, metadata)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "matches", counted)
    try:
        tree = parse_filter({"n": {"gte": 10}})
        query = unit_vectors(np.random.default_rng(1), 1, DIM)[0]
        cancel = CancelToken()
        dense = store.search("c1", "ns", allowed, query, 50, cancel, tree)
        lexical = store.lexical_search("c1", "ns", allowed, ["alpha"], 50, cancel, tree)
        scores = store.lexical_scores("c1", "ns", allowed, dense[:3], ["alpha"], cancel, tree)
        assert len(dense) == len(lexical) == 20 and all(v is not None for v in scores)
        assert len(evaluated) == 30  # once per allowed source, not three times
        # Another filter (or grant) object is evaluated afresh.
        store.search("c1", "ns", allowed, query, 50, cancel, parse_filter({"n": {"lt": 5}}))
        assert len(evaluated) == 60
    finally:
        store.close()


def _store_write(
    store: SqliteVectorStore, source_id: str, revision_id: str, n: int, expected: str | None
) -> None:
    vectors = unit_vectors(np.random.default_rng(n), 1, DIM)
    source, chunks = revision(source_id, revision_id, vectors, metadata={"n": n})
    limits = CapacityLimits()
    store.replace_source("c1", "ns", source, chunks, expected_revision=expected, limits=limits)


def test_a_filter_is_evaluated_outside_the_cache_lock_and_sees_writes_made_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter held the store's cache lock for its whole evaluation (~0.4 ms per source for
    256 conditions: seconds over 10,000 sources, every search and write of the store waiting).
    It runs without the lock now; a write landing meanwhile (here: from inside the
    evaluation, which would deadlock under the lock) is decided too before the search reads."""
    store, allowed = _store(tmp_path, 30)
    allowed["s999"] = "r1"  # granted, written while the filter is being evaluated
    evaluated: list[object] = []
    real = segment.matches  # type: ignore[attr-defined]

    def writing(tree: object, metadata: object) -> bool:
        assert not store._cache_lock.locked()
        evaluated.append(metadata)
        if len(evaluated) == 1:
            _store_write(store, "s999", "r1", 500, None)  # a new granted source that matches
            _store_write(store, "s012", "r2", 20, "r1")  # s012 leaves the grant (r1 is granted)
        return real(tree, metadata)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "matches", writing)
    try:
        tree = parse_filter({"n": {"gte": 10}})
        query = unit_vectors(np.random.default_rng(1), 1, DIM)[0]
        hits = store.search("c1", "ns", allowed, query, 50, CancelToken(), tree)
        expected = {f"s{i:03d}" for i in range(10, 30) if i != 12} | {"s999"}
        assert {h.source_id for h in hits} == expected
        assert len(evaluated) == 31  # the 30 first granted revisions, then s999 once
    finally:
        store.close()


def test_a_cancelled_search_stops_evaluating_its_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, allowed = _store(tmp_path, 3 * segment.DECIDE_BATCH)
    cancel = CancelToken()
    evaluated: list[object] = []
    real = segment.matches  # type: ignore[attr-defined]

    def cancelling(tree: object, metadata: object) -> bool:
        evaluated.append(metadata)
        cancel.cancel()
        return real(tree, metadata)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "matches", cancelling)
    try:
        query = unit_vectors(np.random.default_rng(1), 1, DIM)[0]
        with pytest.raises(RetrievalError) as raised:
            store.search("c1", "ns", allowed, query, 10, cancel, parse_filter({"n": {"gte": 1}}))
        assert raised.value.code is ErrorCode.CANCELLED
        assert len(evaluated) == segment.DECIDE_BATCH  # stopped at the next check
    finally:
        store.close()

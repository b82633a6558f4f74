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

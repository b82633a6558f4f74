"""The SQLite store's scan: runs scored in place, shared scans, and the grant cache.

Whatever path a search takes (one thread or several, rows in place or a cached copy of a
scattered grant), it returns exactly the answer of a brute-force scan of the allowed rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.sqlite import scan as sqlite_scan
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor, EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Location
from retrieval_host.core.ports import CapacityLimits, StoredChunk, StoredSource

DIMS = 8
PER_SOURCE = 10
SOURCES = 60
LIMITS = CapacityLimits()
Matrix = npt.NDArray[np.float32]


def _descriptor() -> CorpusDescriptor:
    embedding = EmbeddingDescriptor("p", "v", "a", "none", "m", DIMS)
    return CorpusDescriptor("c1", "v1", embedding)


def _unit(rng: np.random.Generator, n: int) -> Matrix:
    rows = rng.standard_normal((n, DIMS)).astype(np.float32)
    unit: Matrix = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit


def _put(store: SqliteVectorStore, sid: str, rev: str, rows: Matrix, expected: str | None) -> None:
    source = StoredSource(sid, rev, sid, {}, "0" * 64, f"fp-{sid}-{rev}", len(rows))
    chunks = [StoredChunk(f"{sid}:{i}", i, f"{sid} {i}", Location(), r) for i, r in enumerate(rows)]
    store.replace_source("c1", "ns", source, chunks, expected_revision=expected, limits=LIMITS)


@pytest.fixture
def vectors() -> Matrix:
    return _unit(np.random.default_rng(11), SOURCES * PER_SOURCE)


def _open(path: Path, vectors: Matrix, **options: Any) -> SqliteVectorStore:
    store = SqliteVectorStore.open(path, **options)
    store.open_corpus(_descriptor())
    for n in range(SOURCES):
        _put(store, f"s{n:03d}", "r1", vectors[n * PER_SOURCE : (n + 1) * PER_SOURCE], None)
    return store


@pytest.fixture
def store(tmp_path: Path, vectors: Matrix) -> Iterator[SqliteVectorStore]:
    with _open(tmp_path / "store.db", vectors, scan_batch_rows=7) as opened:
        yield opened


def _brute(vectors: Matrix, sources: list[int], query: Matrix, k: int) -> list[str]:
    rows = np.concatenate([np.arange(n * PER_SOURCE, (n + 1) * PER_SOURCE) for n in sources])
    scores = vectors[rows].astype(np.float64) @ query.astype(np.float64)
    best = rows[np.argsort(-scores, kind="stable")[:k]]
    return [f"s{r // PER_SOURCE:03d}:{r % PER_SOURCE}" for r in best]


def _ids(store: SqliteVectorStore, sources: list[int], query: Matrix, k: int = 5) -> list[str]:
    allowed = {f"s{n:03d}": "r1" for n in sources}
    return [c.chunk_id for c in store.search("c1", "ns", allowed, query, k, CancelToken())]


def test_a_scattered_grant_searched_again_gives_the_same_exact_answer(
    store: SqliteVectorStore, vectors: Matrix
) -> None:
    grant = [1, 4, 5, 9, 17, 30, 31, 44]  # runs of one and two sources
    for query in _unit(np.random.default_rng(5), 6):
        expected = _brute(vectors, grant, query, 5)
        assert [_ids(store, grant, query) for _ in range(3)] == [expected] * 3
    assert store._grants._bytes == len(grant) * PER_SOURCE * DIMS * 4  # served from one copy


def test_a_cached_grant_never_serves_a_replaced_revision(
    store: SqliteVectorStore, vectors: Matrix
) -> None:
    grant = [2, 7, 12]
    query = vectors[7 * PER_SOURCE + 3]
    for _ in range(3):
        assert _ids(store, grant, query, 1) == ["s007:3"]
    _put(store, "s007", "r2", -vectors[7 * PER_SOURCE : 8 * PER_SOURCE], "r1")
    allowed = {"s002": "r1", "s007": "r2", "s012": "r1"}
    hits = store.search("c1", "ns", allowed, query, 3, CancelToken())
    assert all(h.chunk_id != "s007:3" or h.revision == "r2" for h in hits)
    assert "s007:3" not in [h.chunk_id for h in hits]  # its new vector points away


def test_the_cache_off_gives_the_same_answers(tmp_path: Path, vectors: Matrix) -> None:
    grant = list(range(0, SOURCES, 3))
    queries = _unit(np.random.default_rng(9), 4)
    with _open(tmp_path / "off.db", vectors, grant_cache_bytes=0) as off:
        answers = [[_ids(off, grant, q) for q in queries] for _ in range(2)]
        assert off._grants._bytes == 0
    assert answers[0] == answers[1] == [_brute(vectors, grant, q, 5) for q in queries]


def test_a_scan_shared_with_the_pool_equals_the_brute_force_answer(
    tmp_path: Path, vectors: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_scan, "PARALLEL_MIN_ROWS", 1)
    with _open(tmp_path / "shared.db", vectors, scan_batch_rows=5) as shared:
        shared._scanner._helpers = 1  # a helper thread even on a one-core machine
        every = list(range(SOURCES))
        for query in _unit(np.random.default_rng(3), 4):
            assert _ids(shared, every, query, 7) == _brute(vectors, every, query, 7)
        assert shared.counters.scan_batches == 4 * (SOURCES * PER_SOURCE // 5)


def test_the_grant_cache_budget_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="grant_cache_bytes"):
        SqliteVectorStore.open(tmp_path / "store.db", grant_cache_bytes=-1)


@pytest.mark.parametrize("k", [1, 3, 4, 10, 25])
def test_every_thread_keeps_exactly_its_best_k_across_batches(
    tmp_path: Path, vectors: Matrix, k: int
) -> None:
    # Batches of 3 rows: k above, at and below the batch size, first batch and later ones.
    with _open(tmp_path / "k.db", vectors, scan_batch_rows=3, grant_cache_bytes=0) as small:
        grant = list(range(0, SOURCES, 2))
        for query in _unit(np.random.default_rng(k), 3):
            assert _ids(small, grant, query, k) == _brute(vectors, grant, query, k)


def test_a_remembered_grant_never_outlives_a_change_to_its_sources(
    store: SqliteVectorStore, vectors: Matrix
) -> None:
    grant = [3, 8, 20]
    segment = store._state("c1").segments["ns"]
    query = vectors[8 * PER_SOURCE + 2]
    assert [_ids(store, grant, query, 1) for _ in range(2)] == [["s008:2"]] * 2
    assert len(segment.captures) == 1  # the second search reused the first one's capture
    _put(store, "s008", "r2", -vectors[8 * PER_SOURCE : 9 * PER_SOURCE], "r1")
    assert not segment.captures
    # The grant still names r1 of s008, which is gone: none of s008's rows may come back.
    assert all(not c.startswith("s008:") for c in _ids(store, grant, query, 30))
    store.delete_source("c1", "ns", "s003", "r1")
    assert all(c.startswith("s020:") for c in _ids(store, grant, query, 30))
    newer = store.search("c1", "ns", {"s008": "r2"}, -query, 1, CancelToken())
    assert [(c.chunk_id, c.revision) for c in newer] == [("s008:2", "r2")]


def test_each_searching_thread_checks_freshness_on_its_own_connection(
    tmp_path: Path, vectors: Matrix
) -> None:
    path = tmp_path / "fresh.db"
    with _open(path, vectors) as reader, SqliteVectorStore.open(path) as writer:
        writer.open_corpus(_descriptor())
        query = vectors[5 * PER_SOURCE]
        done: list[list[str]] = []

        def search() -> None:
            done.append(_ids(reader, [5], query, 1))

        threads = [threading.Thread(target=search) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert done == [["s005:0"]] * 3
        assert reader._readers.opened == 3  # one per thread, none shared
        # Another connection's commit is seen by the next search on any thread.
        _put(writer, "s005", "r2", -vectors[5 * PER_SOURCE : 6 * PER_SOURCE], "r1")
        assert _ids(reader, [5], query, 1) == []  # r1 of s005 is gone
        reader.close()
        assert reader._readers.opened == 0
        with pytest.raises(RetrievalError) as caught:
            _ids(reader, [5], query, 1)
        assert caught.value.code is ErrorCode.STORE_UNAVAILABLE


def test_more_hot_grants_than_the_budget_holds_are_not_copied_over_each_other(
    tmp_path: Path, vectors: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four scattered grants of 8 sources (2,560 bytes of rows each), a budget for two
    # copies, searched in rotation: LRU alone would copy one grant per search and evict the
    # next one to be searched. Admission keeps the first two copied and scores the others in
    # place, with the same exact answers.
    grants = [list(range(start, SOURCES, 7))[:8] for start in range(4)]
    copies = 0
    take = np.take

    def counting_take(*args: Any, **kwargs: Any) -> Any:
        nonlocal copies
        copies += 1
        return take(*args, **kwargs)

    query = _unit(np.random.default_rng(3), 1)[0]
    with _open(tmp_path / "small.db", vectors, grant_cache_bytes=2 * 2560 + 100) as small:
        monkeypatch.setattr(np, "take", counting_take)
        for _ in range(10):
            for grant in grants:
                assert _ids(small, grant, query) == _brute(vectors, grant, query, 5)
        assert copies == 2
        assert small._grants._bytes == 2 * 2560

"""Approximate dense search: a graph ranks only searches allowed every live row of a namespace,
its results are re-scored exactly, and the rows changed since its build are neither lost nor
leaked."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore, approximate
from retrieval_host.adapters.sqlite.segment import COMPACT_MIN_ROWS
from retrieval_host.adapters.sqlite.snapshot import current_identity, snapshot_path
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.filters import parse_filter
from retrieval_host.core.ports import ApproximateRanking, Candidate, CapacityLimits
from tests.support.sqlite_store import descriptor, revision

DIM = 32
PER_SOURCE = 50
SOURCES = 60  # 3,000 rows
MIN_ROWS = 1000
LIMITS = CapacityLimits()
Matrix = npt.NDArray[np.float32]


def clustered(rng: np.random.Generator, n: int) -> Matrix:
    """Unit rows around a few centres (nearest neighbours are meaningful, unlike noise)."""
    centres = np.random.default_rng(7).standard_normal((20, DIM))
    rows = centres[rng.integers(0, 20, n)] + 0.4 * rng.standard_normal((n, DIM))
    unit: Matrix = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return unit


class Namespace:
    """A store's namespace "ns" of corpus "c1" and the vectors of its live revisions, so that
    the true top k is computed without the store."""

    def __init__(self, store: SqliteVectorStore) -> None:
        self.store = store
        self.live: dict[str, tuple[str, Matrix]] = {}
        store.open_corpus(descriptor("c1", dimensions=DIM))

    def put(self, sid: str, rev: str, vectors: Matrix) -> None:
        previous = self.live.get(sid)
        source, chunks = revision(sid, rev, vectors, metadata={"group": sid[-1]})
        self.store.replace_source(
            "c1",
            "ns",
            source,
            chunks,
            expected_revision=None if previous is None else previous[0],
            limits=LIMITS,
        )
        self.live[sid] = (rev, vectors)

    def delete(self, sid: str) -> None:
        self.store.delete_source("c1", "ns", sid, self.live.pop(sid)[0])

    def everything(self) -> dict[str, str]:
        allowed = self.store.current_revisions("c1", "ns")
        assert allowed == {sid: rev for sid, (rev, _) in self.live.items()}
        return allowed

    def search(self, allowed: dict[str, str], query: Matrix, k: int = 10) -> list[Candidate]:
        return self.store.search("c1", "ns", allowed, query, k, CancelToken())

    def ids(self, allowed: dict[str, str], query: Matrix, k: int = 10) -> list[str]:
        return [h.chunk_id for h in self.search(allowed, query, k)]

    def exact(self, allowed: dict[str, str], query: Matrix, k: int = 10) -> dict[str, float]:
        """The true top k of the allowed live revisions: chunk id -> cosine."""
        scored = [
            (float(v @ query), f"{sid}:{i}")
            for sid, (rev, vectors) in self.live.items()
            if allowed.get(sid) == rev
            for i, v in enumerate(vectors)
        ]
        scored.sort(key=lambda item: -item[0])
        return {chunk_id: score for score, chunk_id in scored[:k]}

    def fill(self, rng: np.random.Generator, sources: int, prefix: str = "s") -> None:
        for i in range(sources):
            self.put(f"{prefix}{i:03d}", "r1", clustered(rng, PER_SOURCE))

    def built(self, query: Matrix) -> None:
        """Search once (asks for a graph), wait for the build, and check the graph serves."""
        allowed = self.everything()
        self.search(allowed, query)
        self.store.wait_for_graphs()
        before = self.store.counters.approximate_searches
        self.search(allowed, query)
        assert self.store.counters.approximate_searches == before + 1

    @property
    def approximate(self) -> int:
        return self.store.counters.approximate_searches


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[Namespace]:
    with SqliteVectorStore.open(tmp_path / "s.db", approximate_min_rows=MIN_ROWS) as store:
        namespace = Namespace(store)
        namespace.fill(np.random.default_rng(1), SOURCES)
        yield namespace


def test_whole_namespace_ranked_by_the_graph_with_exact_scores(ns: Namespace) -> None:
    allowed = ns.everything()
    queries = clustered(np.random.default_rng(2), 40)
    first = ns.search(allowed, queries[0])  # the exact scan; asks for a graph
    assert ns.approximate == 0
    assert not isinstance(first, ApproximateRanking)
    ns.store.wait_for_graphs()
    found = 0
    for query in queries:
        hits = ns.search(allowed, query)
        assert isinstance(hits, ApproximateRanking)  # so core adds the lexical index's best
        truth = ns.exact(allowed, query, k=100_000)
        assert len(hits) == 10
        found += len({h.chunk_id for h in hits} & set(list(truth)[:10]))
        for hit in hits:  # the exact cosine (re-scored), never the int8 distance
            assert hit.score == pytest.approx(truth[hit.chunk_id], abs=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert ns.approximate == len(queries)
    assert found / (10 * len(queries)) >= 0.99


def test_a_partial_grant_or_a_filter_is_always_scanned_exactly(ns: Namespace) -> None:
    allowed = ns.everything()
    query = clustered(np.random.default_rng(3), 1)[0]
    ns.built(query)
    before = ns.approximate
    partial = dict(list(allowed.items())[1:])  # one source fewer
    assert set(ns.ids(partial, query, k=20)) == set(ns.exact(partial, query, k=20))
    # Every source named, one at an older revision: not the whole live set either.
    stale = dict(allowed, s001="r0")
    assert not any(c.startswith("s001:") for c in ns.ids(stale, query, k=200))
    filtered = ns.store.search(
        "c1", "ns", allowed, query, 200, CancelToken(), parse_filter({"group": "1"})
    )
    assert filtered and all(h.metadata["group"] == "1" for h in filtered)
    assert ns.approximate == before


def test_rows_added_after_the_build_are_found(ns: Namespace) -> None:
    rng = np.random.default_rng(4)
    ns.built(clustered(rng, 1)[0])
    fresh = clustered(rng, 3)
    ns.put("new", "r1", fresh)
    before = ns.approximate
    hits = ns.search(ns.everything(), fresh[1], k=5)
    assert hits[0].chunk_id == "new:1" and hits[0].score == pytest.approx(1.0, abs=1e-6)
    assert ns.approximate == before + 1


def test_rows_that_died_after_the_build_never_return(ns: Namespace) -> None:
    rng = np.random.default_rng(5)
    query = clustered(rng, 1)[0]
    # More rows next to the query than the graph is asked for: all of them die below.
    near = query + 0.01 * rng.standard_normal((approximate.MIN_CANDIDATES + 16, DIM))
    ns.put("hot", "r1", (near / np.linalg.norm(near, axis=1, keepdims=True)).astype(np.float32))
    ns.built(query)
    # The sources of the best answers: three replaced (new vectors), two deleted.
    owners = list(dict.fromkeys(c.split(":")[0] for c in ns.ids(ns.everything(), query, k=200)))
    assert owners[0] == "hot" and len(owners) >= 5
    for sid in owners[:3]:
        ns.put(sid, "r2", clustered(rng, PER_SOURCE))
    for sid in owners[3:5]:
        ns.delete(sid)
    allowed = ns.everything()
    before = ns.approximate
    hits = ns.search(allowed, query, k=10)
    assert ns.approximate == before + 1
    assert len(hits) == 10
    for hit in hits:
        assert hit.source_id not in owners[3:5]
        assert hit.revision == allowed[hit.source_id]  # a replaced source's new row only
    assert {h.chunk_id for h in hits} == set(ns.exact(allowed, query))


def test_members_the_graph_cuts_off_are_still_found(tmp_path: Path) -> None:
    """A few points apart from one dense cluster of many (a black-box test: English passages
    among 20,000 of generated words): HNSW's pruning leaves some of them no way in, so its
    search never returns them. The build's self-check finds those, and every search scores
    them exactly."""
    rng = np.random.default_rng(31)
    apart = rng.standard_normal((PER_SOURCE, DIM))
    centre = rng.standard_normal(DIM)
    with SqliteVectorStore.open(tmp_path / "o.db", approximate_min_rows=MIN_ROWS) as store:
        ns = Namespace(store)
        ns.put(
            "apart", "r1", (apart / np.linalg.norm(apart, axis=1, keepdims=True)).astype(np.float32)
        )
        for i in range(100):  # 5,000 rows within a narrow cone
            near = centre + 0.3 * rng.standard_normal((PER_SOURCE, DIM))
            unit = near / np.linalg.norm(near, axis=1, keepdims=True)
            ns.put(f"c{i:03d}", "r1", unit.astype(np.float32))
        outliers = ns.live["apart"][1]
        ns.built(outliers[0])
        graph = store._corpora["c1"].segments["ns"].graph
        assert graph is not None
        # The graph alone misses some of them (what this test is about)...
        lost = [i for i, v in enumerate(outliers) if i not in graph.nearest(v[None, :], 64)]
        assert lost, "the graph reached every point apart: the test no longer shows the cut"
        assert set(lost) <= set(graph.unreachable.tolist())
        # ...and every search still finds each one first, at its exact score. (What follows it
        # here is a cluster far from it: the low-contrast tail an approximate search may
        # order differently from the exact scan.)
        allowed = ns.everything()
        before = ns.approximate
        for i, vector in enumerate(outliers):
            hits = ns.search(allowed, vector, k=5)
            assert hits[0].chunk_id == f"apart:{i}"
            assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert ns.approximate == before + len(outliers)


def test_a_compaction_drops_the_graph_and_a_new_one_is_built(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    count = COMPACT_MIN_ROWS // PER_SOURCE + 2
    with SqliteVectorStore.open(tmp_path / "c.db", approximate_min_rows=MIN_ROWS) as store:
        ns = Namespace(store)
        ns.fill(rng, count)
        query = clustered(rng, 1)[0]
        ns.built(query)
        graphs = store._graphs.built
        segment = store._corpora["c1"].segments["ns"]
        matrix = segment.matrix
        rev = 2
        while segment.matrix is matrix:  # replace every source until the array is compacted
            for i in range(count):
                ns.put(f"s{i:03d}", f"r{rev}", clustered(rng, PER_SOURCE))
            rev += 1
        assert segment.graph is None
        allowed = ns.everything()
        before = ns.approximate
        assert set(ns.ids(allowed, query)) == set(ns.exact(allowed, query))  # exact; asks
        assert ns.approximate == before
        store.wait_for_graphs()
        assert store._graphs.built == graphs + 1
        assert set(ns.ids(allowed, query)) == set(ns.exact(allowed, query))
        assert ns.approximate == before + 1


def test_a_stale_graph_is_rebuilt(ns: Namespace) -> None:
    query = clustered(np.random.default_rng(9), 1)[0]
    ns.built(query)
    graphs = ns.store._graphs.built
    extra = int(approximate.STALE_FRACTION * SOURCES) + 1  # over a quarter of the graph's rows
    ns.fill(np.random.default_rng(10), extra, prefix="t")
    allowed = ns.everything()
    before = ns.approximate
    ns.search(allowed, query)  # served (the tail scanned), and asks for a new graph
    assert ns.approximate == before + 1
    ns.store.wait_for_graphs()
    assert ns.store._graphs.built == graphs + 1
    graph = ns.store._corpora["c1"].segments["ns"].graph
    assert graph is not None and graph.members == (SOURCES + extra) * PER_SOURCE
    assert set(ns.ids(allowed, query)) == set(ns.exact(allowed, query))


def test_small_namespaces_and_a_zero_threshold_never_build(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    for threshold, sources in ((MIN_ROWS, MIN_ROWS // PER_SOURCE - 1), (0, SOURCES)):
        with SqliteVectorStore.open(
            tmp_path / f"{threshold}.db", approximate_min_rows=threshold
        ) as store:
            ns = Namespace(store)
            ns.fill(rng, sources)
            query = clustered(rng, 1)[0]
            ns.search(ns.everything(), query)
            store.wait_for_graphs()
            assert set(ns.ids(ns.everything(), query)) == set(ns.exact(ns.everything(), query))
            assert store._graphs.built == 0
            assert ns.approximate == 0
    with pytest.raises(ValueError, match="approximate_min_rows"):
        SqliteVectorStore.open(tmp_path / "x.db", approximate_min_rows=-1)


def test_close_stops_a_build_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build checks for a close between batches: closing never waits for a whole graph."""
    monkeypatch.setattr(approximate, "BUILD_BATCH_ROWS", 100)
    started, release = threading.Event(), threading.Event()
    original = approximate.Builder._build

    def held(self: approximate.Builder, *args: Any) -> None:
        started.set()
        release.wait()
        original(self, *args)

    monkeypatch.setattr(approximate.Builder, "_build", held)
    store = SqliteVectorStore.open(tmp_path / "b.db", approximate_min_rows=MIN_ROWS)
    ns = Namespace(store)
    rng = np.random.default_rng(12)
    ns.fill(rng, SOURCES)
    ns.search(ns.everything(), clustered(rng, 1)[0])
    assert started.wait(60)
    closing = threading.Event()
    original_close = approximate.Builder.close

    def close(self: approximate.Builder) -> None:
        with self._lock:
            self._closed = True
        closing.set()
        original_close(self)

    monkeypatch.setattr(approximate.Builder, "close", close)
    closer = threading.Thread(target=store.close)
    closer.start()
    assert closing.wait(60)  # closed before the build adds its first batch
    release.set()
    closer.join(60)
    assert not closer.is_alive()
    assert store._graphs.built == 0


def test_the_graph_library_loads_so_that_the_model_runtime_still_loads() -> None:
    """usearch first, then onnxruntime, crashes the process: the store's loader prevents it."""
    script = (
        "from retrieval_host.adapters.sqlite.approximate import usearch_index\n"
        "usearch_index()(ndim=8, metric='ip', dtype='i8')\n"
        "import onnxruntime\n"
        "print(onnxruntime.get_device())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CPU"


# --- graphs shared through a file beside the index snapshot -----------------------------------


def snapshotted(path: Path) -> Namespace:
    """A store at `path` whose index is a snapshot (written at the first store's close), with
    the live revisions' vectors known to the returned (closed) namespace."""
    with SqliteVectorStore.open(path, approximate_min_rows=MIN_ROWS) as store:
        ns = Namespace(store)
        ns.fill(np.random.default_rng(20), SOURCES)
    return ns


def reopened(path: Path, ns: Namespace, **options: Any) -> Namespace:
    again = Namespace.__new__(Namespace)
    again.store = SqliteVectorStore.open(path, approximate_min_rows=MIN_ROWS, **options)
    again.live = ns.live
    again.store.open_corpus(descriptor("c1", dimensions=DIM))
    return again


def graph_files(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if "-graph-" in p.name)


def test_stores_mapping_one_snapshot_share_one_graph_file(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(21), 1)[0]
    first, second = reopened(path, ns), reopened(path, ns)
    try:
        first.built(query)
        assert (first.store._graphs.built, first.store._graphs.viewed) == (1, 0)
        written, check = graph_files(path)
        assert check.name == written.name + ".unreachable"  # the build's self-check
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in (written, check))
        second.built(query)  # maps the file and reads its check: no second build
        assert (second.store._graphs.built, second.store._graphs.viewed) == (0, 1)
        cuts = [
            ns.store._corpora["c1"].segments["ns"].graph.unreachable  # type: ignore[union-attr]
            for ns in (first, second)
        ]
        assert np.array_equal(cuts[0], cuts[1])
        allowed = second.everything()
        for q in clustered(np.random.default_rng(22), 10):
            assert set(second.ids(allowed, q)) == set(second.exact(allowed, q))
    finally:
        first.store.close()
        second.store.close()
    assert graph_files(path) == [written, check]  # no lock or temporary left


def test_a_graph_file_without_its_own_check_is_checked_by_the_process_that_maps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier release's file (no check beside it), or a check of another build of it:
    the mapping process checks the graph itself, and writes the check for the next."""
    path = tmp_path / "k.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(26), 1)[0]
    first = reopened(path, ns)
    try:
        first.built(query)
    finally:
        first.store.close()
    _, check = graph_files(path)
    checked: list[int] = []
    real = approximate.Builder._unreachable

    def counting(self: Any, index: Any, matrix: Any, rows: Any) -> Any:
        checked.append(len(rows))
        return real(self, index, matrix, rows)

    monkeypatch.setattr(approximate.Builder, "_unreachable", counting)
    for case in ("missing", "another build's", "truncated"):
        if case == "missing":
            check.unlink()
        elif case == "truncated":
            check.write_bytes(b"")
        else:
            record = np.load(check)
            record[0] += 1  # another identity: the check of a file since replaced
            with check.open("wb") as out:
                np.save(out, record)
        checked.clear()
        other = reopened(path, ns)
        try:
            other.built(query)
            assert (other.store._graphs.built, other.store._graphs.viewed) == (0, 1), case
            assert checked == [SOURCES * PER_SOURCE], case
            allowed = other.everything()
            assert set(other.ids(allowed, query)) == set(other.exact(allowed, query))
        finally:
            other.store.close()
        assert check.exists(), case  # written for the processes that map the file next
    third = reopened(path, ns)  # finds the check the last one wrote: no check of its own
    checked.clear()
    try:
        third.built(query)
        assert (third.store._graphs.viewed, checked) == (1, []), checked
    finally:
        third.store.close()


def test_a_graph_another_process_is_building_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live holder of the build lock: the store scans exactly and looks again later; a lock
    whose holder is gone is taken over."""
    monkeypatch.setattr(approximate, "SHARED_RETRY_S", 0.0)
    path = tmp_path / "w.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(23), 1)[0]
    ns = reopened(path, ns)
    try:
        allowed = ns.everything()  # loads the corpus (maps the snapshot)
        origin = ns.store._corpora["c1"].segments["ns"].origin
        assert origin is not None
        lock = origin.path.with_name(origin.path.name + ".lock")
        lock.write_text(str(os.getpid()))  # a live process (this one) builds it
        assert set(ns.ids(allowed, query)) == set(ns.exact(allowed, query))
        ns.store.wait_for_graphs()
        assert ns.store._graphs.built == 0 and ns.approximate == 0
        assert not origin.path.exists()
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        lock.write_text(gone.stdout.strip())  # its holder exited: taken over
        # What interrupted writes left: removed only when their writer is gone.
        dead = origin.path.with_name(f"{origin.path.name}.{gone.stdout.strip()}.tmp")
        busy = origin.path.with_name(f"{origin.path.name}.{os.getppid()}.tmp")
        dead.write_bytes(b"x")
        busy.write_bytes(b"x")
        ns.built(query)
        assert ns.store._graphs.built == 1 and origin.path.exists() and not lock.exists()
        assert not dead.exists() and busy.exists()
    finally:
        ns.store.close()


def test_an_unusable_graph_file_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "u.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(24), 1)[0]
    ns = reopened(path, ns)
    try:
        ns.everything()
        origin = ns.store._corpora["c1"].segments["ns"].origin
        assert origin is not None
        origin.path.write_bytes(b"not a graph" * 100)
        origin.path.chmod(0o600)
        with caplog.at_level(logging.WARNING, logger="retrieval_host.store"):
            ns.built(query)
        assert "not used" in caplog.text
        assert ns.store._graphs.built == 1
        allowed = ns.everything()
        assert set(ns.ids(allowed, query)) == set(ns.exact(allowed, query))
    finally:
        ns.store.close()
    other = reopened(path, ns)  # the replacement is a good one
    try:
        other.built(query)
        assert (other.store._graphs.built, other.store._graphs.viewed) == (0, 1)
    finally:
        other.store.close()


def test_a_read_only_store_builds_its_own_graph_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(25), 1)[0]
    ns = reopened(path, ns, read_only=True)
    try:
        ns.built(query)
        assert ns.store._graphs.built == 1
        assert graph_files(path) == []
    finally:
        ns.store.close()


def test_a_delete_removes_the_graph_files_that_held_its_vectors(tmp_path: Path) -> None:
    # A black-box test: deleted rows' text stayed in the snapshot and their vectors in its
    # graph files; the delete now has the snapshot rewritten, and no graph fits the new file.
    path = tmp_path / "d.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(27), 1)[0]
    first = reopened(path, ns)
    try:
        first.built(query)
        assert graph_files(path)
        first.delete(sorted(first.live)[0])
        deadline = time.monotonic() + 120
        while graph_files(path):
            assert time.monotonic() < deadline, graph_files(path)
            time.sleep(0.01)
        allowed = first.everything()
        for q in clustered(np.random.default_rng(28), 5):
            assert set(first.ids(allowed, q)) == set(first.exact(allowed, q))
    finally:
        first.store.close()
    again = reopened(path, ns)
    try:
        again.live = first.live
        allowed = again.everything()
        for q in clustered(np.random.default_rng(29), 5):
            assert set(again.ids(allowed, q)) == set(again.exact(allowed, q))
    finally:
        again.store.close()


def test_a_graph_of_a_snapshot_a_delete_rewrote_is_kept_in_memory_not_written(
    tmp_path: Path,
) -> None:
    # A black-box test: a delete landing during the first graph build after a start had the
    # snapshot rewritten (its graph files removed), then the build wrote its graph, the
    # deleted rows' int8 vectors in it, under the old file's version, for good.
    path = tmp_path / "r.db"
    ns = snapshotted(path)
    query = clustered(np.random.default_rng(30), 1)[0]
    first = reopened(path, ns)
    try:
        snap = snapshot_path(path, "c1")
        mapped = current_identity(snap)
        first.delete(sorted(first.live)[0])
        deadline = time.monotonic() + 120
        while current_identity(snap) == mapped:  # the delete's background rewrite
            assert time.monotonic() < deadline, "the snapshot was not rewritten"
            time.sleep(0.01)
        first.built(query)  # of the rows the old file mapped, after the rewrite
        assert graph_files(path) == []
        allowed = first.everything()
        for q in clustered(np.random.default_rng(31), 5):
            assert set(first.ids(allowed, q)) == set(first.exact(allowed, q))
    finally:
        first.store.close()
    assert graph_files(path) == []

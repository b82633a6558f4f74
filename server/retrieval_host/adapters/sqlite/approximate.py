"""Approximate dense search for the SQLite store: an HNSW graph (usearch) over a namespace's rows,
used only when a search may see every live row of the namespace.

Authorization filters before ranking, so a graph can only serve a search whose allowed set is
the namespace's whole live set: then there is nothing to filter, and the graph ranks exactly the
rows the search may see (a partial grant is always scanned exactly, which is fast for the sizes
where filtering matters; see bench/README.md, "Every grant size"). The planner (`plan`) decides
from the captured grant's row count.

A graph is built in the background from one segment array (`Segment.matrix`), from the rows
live when the build began, as int8 vectors (a quarter of the float32 size, and two to three
times faster to search); each search asks it for `candidates(k)` rows and re-scores them
exactly against the float32 rows, so the scores are the exact scan's. Rows appended after the
build (the tail) are scanned exactly and merged; rows that died since the build (a source
replaced or deleted) are counted by the segment and asked for in addition, then dropped by the
same run check that bounds every result to the captured grant. When the tail and the dead rows
grow past `STALE_FRACTION` of the graph, or a compaction replaces the array, a new graph is
built and the exact scan serves meanwhile. The figures behind the constants are in
bench/README.md ("Approximate search").

An HNSW graph can cut points off: the pruning that keeps each node's few links keeps those to a
dense cluster of near neighbours, and a point apart from it may be left with no way in (a
black-box test: 47 of 21,857 passages of plain English among 20,000 of generated words, the
quickstart's own answer among them, never found). So every build ends with a self-check: each
member's own vector is searched, and the members it does not return (`Graph.unreachable`) are
scored exactly at every search, beside the graph's candidates. A shared graph's check is
written beside its file (`graph_file.write_unreachable`), so the processes that map it read
it instead of checking again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from retrieval_host.adapters.sqlite import graph_file
from retrieval_host.adapters.sqlite.graph_file import Origin
from retrieval_host.adapters.sqlite.scan import Index, Matrix, Scan, dot_rows
from retrieval_host.memory import trim_heap

if TYPE_CHECKING:
    from retrieval_host.adapters.sqlite.segment import Segment

_log = logging.getLogger("retrieval_host.store")

# Namespaces of fewer live rows are always scanned exactly: at 20k rows a full scan costs about
# a millisecond, and a graph would cost a build for little.
DEFAULT_MIN_ROWS: Final = 20_000
# Graph shape: neighbours per node, and the candidate lists while adding and searching.
CONNECTIVITY: Final = 16
EXPANSION_ADD: Final = 128
EXPANSION_SEARCH: Final = 128
# Candidates asked of the graph per result wanted, and at least: int8 distances only order
# the candidates roughly; the exact re-scoring puts the top k right.
OVERSAMPLE: Final = 4
MIN_CANDIDATES: Final = 64
# A graph whose tail plus dead rows exceed this fraction of its rows is rebuilt.
STALE_FRACTION: Final = 0.25
# Rows added per call while building: the builder checks for a close between calls.
BUILD_BATCH_ROWS: Final = 16_384
# Seconds between two looks for a shared graph that another process is building.
SHARED_RETRY_S: Final = 1.0
# The self-check's search: a member absent from the nearest this many found for its own
# vector, exploring only this many candidates (an eighth of a search's), is scored exactly at
# every search. The narrow search also flags members the graph reaches only barely: a search
# for a query far from every member (low contrast) misses those (measured on the black-box
# state: 47 members missed at full width, 104 at 16, recall@8 of its queries 1.0 then).
# Exact duplicates beyond this many are flagged too: then also scored exactly.
SELF_CHECK: Final = 16


class Graph:
    """An HNSW graph of the live rows below `built` of one segment array, keyed by row."""

    def __init__(
        self, matrix: Matrix, built: int, members: int, index: object, unreachable: Index
    ) -> None:
        self.matrix = matrix  # the array the keys are rows of (a compaction makes a new one)
        self.built = built
        self.members = members
        self.dead = 0  # members whose rows died since the build (`Segment.apply` counts them)
        # Members a search of their own vector does not find: scored exactly every time.
        self.unreachable = unreachable
        self._index = index

    def stale(self, size: int) -> bool:
        """Whether the rows changed since the build (appended or dead) call for a new graph."""
        return self.dead + (size - self.built) > STALE_FRACTION * max(self.members, 1)

    def nearest(self, query: Matrix, count: int) -> Index:
        """The keys (rows) of about the `count` nearest members, by the int8 distances."""
        matches = self._index.search(query, count, threads=1)  # type: ignore[attr-defined]
        keys: Index = np.asarray(matches.keys, dtype=np.int64)
        return keys[(keys >= 0) & (keys < self.built)]


@dataclass(frozen=True, slots=True)
class Plan:
    """An approximate search decided under the cache lock: the graph, and how many of its
    members had died then (asked for in addition, as they may rank and are then dropped)."""

    graph: Graph
    dead: int


def plan(segment: Segment, scan: Scan, min_rows: int, builder: Builder) -> Plan | None:
    """How to search a capture without filters (under the cache lock): with the segment's
    graph when the capture is every live row of a namespace of at least `min_rows` (0: never),
    else None (the exact scan). Asks for a graph when one is wanted and none is usable."""
    if min_rows <= 0 or segment.live < min_rows or scan.total != segment.live:
        return None
    graph = segment.graph
    usable = graph is not None and graph.matrix is segment.matrix
    wanted = graph is None or not usable or graph.stale(segment.size)
    if wanted and not segment.graph_requested and time.monotonic() >= segment.graph_retry_at:
        builder.request(segment, scan)
    if (
        graph is None
        or not usable
        or graph.dead > graph.members // 2
        or len(graph.unreachable) > graph.members // 2
    ):
        # A graph this stale would ask for too many candidates, one cut off this much would
        # score half its members exactly anyway: scan exactly.
        return None
    return Plan(graph, graph.dead)


def candidates(k: int) -> int:
    return max(MIN_CANDIDATES, OVERSAMPLE * k)


def search(plan: Plan, scan: Scan, query: Matrix, k: int) -> tuple[Index, Matrix]:
    """The graph's candidates that the scan holds, re-scored exactly: (rows, scores).

    The scan is the whole live namespace; its tail (rows from `graph.built` on) is not in the
    graph and is scored by the caller's exact scan.
    """
    graph = plan.graph
    rows = graph.nearest(query, candidates(k) + max(plan.dead, 0))
    if len(graph.unreachable):
        rows = np.union1d(rows, graph.unreachable)
    rows = rows[scan.holds(rows)]
    scores: Matrix = np.empty(len(rows), dtype=np.float32)
    if len(rows):
        dot_rows(scan.matrix[rows], query, scores)
    return rows, scores


def usearch_index() -> Any:
    """usearch's `Index` class, loaded after onnxruntime: onnxruntime's extension module
    crashes the process (SIGSEGV) when it is loaded after usearch's (usearch 2.26, onnxruntime
    1.2x), and the host loads the local model's runtime only when a corpus uses it, possibly
    after a graph was built. Loaded in this order, any later import of either is safe."""
    import onnxruntime  # noqa: F401  # first, see above
    from usearch.index import Index as UsearchIndex

    return UsearchIndex


class Builder:
    """Builds graphs on one background thread, one at a time (a store has one builder).

    `request` is called under the store's cache lock with a segment and the scan of its whole
    live set; the build reads only rows of that segment array, which are never rewritten, so it
    runs without a lock and installs the graph with `install` (which takes the lock) unless the
    segment compacted meanwhile. A segment mapped from an index snapshot shares its first graph
    with the other processes that mapped the same file (`graph_file`); later graphs (once a
    quarter of it changed) are the process's own.
    """

    def __init__(
        self, install: Callable[[Callable[[], None]], None], threads: int, writable: bool
    ) -> None:
        self._install = install
        self._threads = threads
        self._writable = writable  # may write shared graph files (not a read-only store)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failed = False  # a build failed: the exact scan serves from then on
        self.built = 0  # graphs built by this process and installed
        self.viewed = 0  # shared graph files mapped and installed

    def request(self, segment: Segment, scan: Scan) -> None:
        """Build (or map) a graph of the scan's rows for `segment`, unless one is under way."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            if self._closed or self._failed or running:
                return
            origin = segment.origin
            if origin is not None and (
                segment.graph is not None or origin.matrix is not segment.matrix
            ):
                origin = None
            thread = threading.Thread(
                target=self._build,
                args=(segment, scan.matrix, segment.size, scan.row_index(), origin),
                name="store-graph",
                daemon=True,
            )
            self._thread = thread
            segment.graph_requested = True
        thread.start()

    def join(self) -> None:
        """Wait for the running build, if any."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """Stop building (a running build stops at its next batch)."""
        with self._lock:
            self._closed = True
        self.join()

    def _build(
        self, segment: Segment, matrix: Matrix, size: int, rows: Index, origin: Origin | None
    ) -> None:
        try:
            if origin is None:
                made = self._checked(matrix, rows)
                graph = None if made is None else Graph(matrix, size, len(rows), *made)
            else:
                graph = self._shared(origin, rows)
            if graph is None:  # closed, or another process is building it: ask again later
                retry = time.monotonic() + SHARED_RETRY_S
                self._install(lambda: _retry(segment, retry))
                return

            def put() -> None:
                segment.graph_requested = False
                if segment.matrix is matrix:
                    segment.adopt(graph)

            self._install(put)
            trim_heap()  # the build's batches and, for a shared graph, the built copy
        except Exception:  # a graph is only an accelerator: the exact scan keeps serving
            _log.exception("building an approximate search graph failed; searches stay exact")
            with self._lock:
                self._failed = True

    def _shared(self, origin: Origin, rows: Index) -> Graph | None:
        """The snapshot's shared graph: mapped from its file, or built and written first (None:
        another process holds the build lock, or the builder closed). A read-only store that
        finds no file builds its own and writes nothing."""
        load = usearch_index().restore
        members = rows[rows < origin.rows]
        viewed = graph_file.view(origin, load)
        found = viewed is not None
        if viewed is None and not self._writable:
            own = self._checked(origin.matrix, members)
            if own is None:
                return None
            return Graph(origin.matrix, origin.rows, len(members), *own)
        if viewed is None:
            held = graph_file.lock(origin)
            if held is None:
                return None
            try:
                built = self._checked(origin.matrix, members)
                if built is None:
                    return None
                if not graph_file.write(origin, *built):
                    # The snapshot was rewritten meanwhile: this process's graph, unshared.
                    return Graph(origin.matrix, origin.rows, len(members), *built)
            finally:
                held.unlink(missing_ok=True)
            viewed = graph_file.view(origin, load)
            if viewed is None:
                raise RuntimeError("the graph file just written cannot be mapped")
        # The check of the very file mapped: its own (read back), or checked here (a file of
        # an earlier release, or of another builder that raced this one).
        index, identity = viewed
        index.expansion_search = EXPANSION_SEARCH
        cut = graph_file.read_unreachable(origin, identity)
        if cut is None:
            keys = np.sort(np.asarray(index.keys, dtype=np.int64))
            cut = self._unreachable(index, origin.matrix, keys)
            if cut is None:
                return None
            if self._writable:
                graph_file.write_unreachable(origin, cut, identity)
        if found:
            self.viewed += 1
        return Graph(origin.matrix, origin.rows, len(index), index, cut)

    def _checked(self, matrix: Matrix, rows: Index) -> tuple[Any, Index] | None:
        """A new graph of these rows and its self-check (None: the builder closed)."""
        index = self._add(matrix, rows)
        cut = None if index is None else self._unreachable(index, matrix, rows)
        return None if index is None or cut is None else (index, cut)

    def _add(self, matrix: Matrix, rows: Index) -> Any | None:
        """A new graph of these rows (None: the builder closed meanwhile)."""
        index = usearch_index()(
            ndim=matrix.shape[1],
            metric="ip",
            dtype="i8",
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )
        for at in range(0, len(rows), BUILD_BATCH_ROWS):
            with self._lock:
                if self._closed:
                    return None
            batch = rows[at : at + BUILD_BATCH_ROWS]
            index.add(batch.astype(np.uint64), matrix[batch], threads=self._threads)
        self.built += 1
        return index

    def _unreachable(self, index: Any, matrix: Matrix, rows: Index) -> Index | None:
        """The members a search of their own vector does not return (None: the builder
        closed meanwhile)."""
        cut: list[Index] = []
        index.expansion_search = SELF_CHECK  # not searched by others yet: installed after
        try:
            for at in range(0, len(rows), BUILD_BATCH_ROWS):
                with self._lock:
                    if self._closed:
                        return None
                batch = rows[at : at + BUILD_BATCH_ROWS]
                found = index.search(matrix[batch], SELF_CHECK, threads=self._threads)
                keys = np.asarray(found.keys, dtype=np.int64).reshape(len(batch), -1)
                # Lists shorter than asked are padded (with key 0, a real row): not matches.
                counts = np.asarray(found.counts, dtype=np.int64).reshape(len(batch), 1)
                listed = np.arange(keys.shape[1])[None, :] < counts
                cut.append(batch[~((keys == batch[:, None]) & listed).any(axis=1)])
        finally:
            index.expansion_search = EXPANSION_SEARCH
        missed: Index = np.concatenate(cut) if cut else np.empty(0, dtype=np.int64)
        if len(missed):
            _log.info(
                "approximate search graph: %d of %d members unreachable, scored exactly",
                len(missed),
                len(rows),
            )
        return missed.astype(np.int64)


def _retry(segment: Segment, at: float) -> None:
    segment.graph_requested = False
    segment.graph_retry_at = at

"""The scan kernel of the SQLite store: score captured rows against a query, keep the top k.

A query's allowed rows are scored in place, in batches of `scan_batch_rows`, checking the cancel
token before each batch and keeping the top k of each. A large scan is shared between the
calling thread and the store's scan threads (one per further core), each running a
single-threaded vectorised kernel, so a scan reads its rows once at close to the memory
bandwidth of the machine. The figures behind the constants are in bench/README.md.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import Vectors
from retrieval_host.core.reasons import InvalidRequestReason, StoreUnavailableReason
from retrieval_host.cpus import usable_cores

if TYPE_CHECKING:
    from retrieval_host.adapters.sqlite.rows import Rows

# Scans of fewer rows run on the caller's thread alone: handing work to another thread costs
# tens of microseconds, and a host serving concurrent searches keeps every core busy anyway.
PARALLEL_MIN_ROWS: Final = 32_768
# Rows scored between two cancel checks: 48 MiB of 384-dim vectors, a few milliseconds of
# reading. Fewer, larger batches keep the per-batch bookkeeping (top k, counters) negligible.
DEFAULT_SCAN_BATCH_ROWS: Final = 32_768
# A scan shared between threads is cut into batches of at least this many rows.
MIN_SHARED_BATCH_ROWS: Final = 4096

Matrix = npt.NDArray[np.float32]
Index = npt.NDArray[np.int64]
Hashes = npt.NDArray[np.int64]  # chunk ids hashed with `rows.chunk_hash`
# Adds to the store's counters (`CounterTally.add`).
Count = Callable[..., None]


def query_unit(query: Vectors, dims: int) -> Matrix:
    """The query as a new float32 unit vector (the per-search path of `_unit_rows`)."""
    array = np.asarray(query)
    if array.shape != (dims,):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"the query vector must have shape ({dims},), the corpus dimensions.",
            reason=InvalidRequestReason.VECTOR_SHAPE,
        )
    unit: Matrix = array.astype(np.float32)  # a copy: the caller's array is never written
    if not np.isfinite(unit).all():
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "the query vector must be finite.",
            reason=InvalidRequestReason.VECTOR_VALUES,
        )
    norm = math.sqrt(float(np.dot(unit.astype(np.float64), unit)))
    if norm == 0:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "the query vector must not be zero.",
            reason=InvalidRequestReason.VECTOR_VALUES,
        )
    unit /= np.float32(norm)
    return unit


def find_rows(
    hashes: Hashes,
    spans: Sequence[tuple[int, int] | None],
    chunk_ids: Sequence[str],
    hash_of: Callable[[str], int],
    chunk_ids_at: Callable[[Sequence[int]], list[str]],
) -> list[int | None]:
    """For each chunk id, the row in its span `(start, stop)` holding it, found by its hash
    (`hash_of`) in `hashes` and checked with `chunk_ids_at` (the chunk ids of rows, read in
    one call: a hybrid read at limit 100 looks up ~800 passages); None when absent or the
    span is None. Vectorized over all the spans' rows at once (a passage's lookup costs no
    Python loop)."""
    found: list[int | None] = [None] * len(chunk_ids)
    held = [(i, span) for i, span in enumerate(spans) if span is not None]
    if not held:
        return found
    at = [i for i, _ in held]
    starts = np.array([start for _, (start, _) in held], dtype=np.int64)
    counts = np.array([stop for _, (_, stop) in held], dtype=np.int64) - starts
    owner = np.repeat(np.arange(len(at)), counts)
    first = np.cumsum(counts) - counts
    rows = starts[owner] + np.arange(len(owner)) - first[owner]
    wanted = np.array([hash_of(chunk_ids[i]) for i in at], dtype=np.int64)
    matched = np.flatnonzero(hashes[rows] == wanted[owner])
    where = rows[matched].tolist()
    for o, row, chunk_id in zip(owner[matched].tolist(), where, chunk_ids_at(where), strict=True):
        i = at[o]
        if found[i] is None and chunk_id == chunk_ids[i]:
            found[i] = row
    return found


def check_stored(vectors: Matrix) -> Matrix:
    """The norms of stored rows, refusing rows no write could have produced."""
    norms: Matrix = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "a stored vector is not finite or is zero.",
            reason=StoreUnavailableReason.CORRUPT_VECTOR,
        )
    return norms


@dataclass(frozen=True, slots=True)
class Scan:
    """What a search captured under the cache lock; scored afterwards without any lock.

    The allowed rows as runs of consecutive matrix rows: run `r` is rows `starts[r]` up to
    `starts[r] + offsets[r + 1] - offsets[r]`, and takes the scan positions `offsets[r]` up to
    `offsets[r + 1]`. Each run is scored in place (a view), never gathered into a copy.
    """

    matrix: Matrix
    rows: Rows
    starts: Index
    offsets: Index
    # The same as Python ints: the per-run loop of a scan indexes them (NumPy scalars cost more).
    start_list: list[int]
    offset_list: list[int]

    @classmethod
    def of(cls, matrix: Matrix, rows: Rows, spans: list[tuple[int, int]]) -> Scan:
        spans.sort()
        if len(spans) > 256:
            starts, offsets = _runs(spans)
            return cls(matrix, rows, starts, offsets, starts.tolist(), offsets.tolist())
        # A few spans: merging them in Python costs less than NumPy's per-call overhead.
        start_list: list[int] = []
        offset_list = [0]
        end = -1
        for start, stop in spans:
            if start == end:
                offset_list[-1] += stop - start
            else:
                start_list.append(start)
                offset_list.append(offset_list[-1] + stop - start)
            end = stop
        return cls(
            matrix,
            rows,
            np.array(start_list, dtype=np.int64),
            np.array(offset_list, dtype=np.int64),
            start_list,
            offset_list,
        )

    @classmethod
    def contiguous(cls, matrix: Matrix, rows: Rows) -> Scan:
        """All of `matrix` as one run (a grant's rows gathered in scan order)."""
        total = len(matrix)
        return cls(
            matrix, rows, np.zeros(1, np.int64), np.array([0, total], np.int64), [0], [0, total]
        )

    @property
    def total(self) -> int:
        return self.offset_list[-1]

    def row_index(self) -> Index:
        """Every matrix row of the scan, in scan order."""
        lengths = np.diff(self.offsets)
        return np.repeat(self.starts - self.offsets[:-1], lengths) + np.arange(
            self.total, dtype=np.int64
        )

    def holds(self, rows: Index) -> npt.NDArray[np.bool_]:
        """Which of these matrix rows the scan holds (its runs are sorted and disjoint)."""
        run = np.searchsorted(self.starts, rows, side="right") - 1
        clipped = np.maximum(run, 0)
        length = self.offsets[clipped + 1] - self.offsets[clipped]
        held: npt.NDArray[np.bool_] = (run >= 0) & (rows < self.starts[clipped] + length)
        return held

    def after(self, row: int) -> Scan | None:
        """The part of the scan at matrix rows from `row` on (None: nothing there)."""
        stops = self.starts + np.diff(self.offsets)
        first = int(np.searchsorted(stops, row, side="right"))
        if first == len(stops):
            return None
        starts = self.starts[first:].copy()
        starts[0] = max(int(starts[0]), row)
        offsets = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(stops[first:] - starts, out=offsets[1:])
        return Scan(self.matrix, self.rows, starts, offsets, starts.tolist(), offsets.tolist())

    def row_numbers(self, positions: Index) -> Index:
        """The matrix rows at these scan positions."""
        run = np.searchsorted(self.offsets, positions, side="right") - 1
        return self.starts[run] + (positions - self.offsets[run])


def _runs(spans: list[tuple[int, int]]) -> tuple[Index, Index]:
    """Sorted spans merged where one ends where the next starts: (starts, offsets)."""
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    stops = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    first = np.flatnonzero(np.r_[True, starts[1:] != stops[:-1]])
    last = np.r_[first[1:] - 1, len(spans) - 1]
    run_starts = starts[first]
    offsets = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(stops[last] - run_starts, out=offsets[1:])
    return run_starts, offsets


def dot_rows(block: Matrix, query: Matrix, out: Matrix) -> None:
    """`out[i] = block[i] . query`, computed in the calling thread only.

    Not a matrix-vector product: OpenBLAS's sgemv hands every call above a few thousand
    elements to its own thread pool, and on a busy machine a scan of many batch-sized calls
    then waits for helper threads that other work has descheduled (measured here: 8192-row
    batches 5-10x slower than one call). `vecdot` takes one vectorised dot product per row
    (too short for BLAS to thread), releases the GIL and costs about a microsecond per call,
    so a scan of many short runs stays cheap and the store alone decides the parallelism.
    """
    np.vecdot(block, query, out=out)


class ScanJob:
    """One search's scan: batches of scan positions, claimed in order by one or more threads.

    Every thread checks the cancel token before each batch it claims and keeps the best `k`
    of the batches it scored; the caller merges them. After a failure (a cancel) no new
    batch starts.
    """

    def __init__(
        self,
        count: Count,
        scan: Scan,
        query: Matrix,
        k: int,
        cancel: CancelToken,
        batch: int,
    ) -> None:
        self.count = count
        self.scan = scan
        self.query = query
        self.k = k
        self.cancel = cancel
        self.batch = batch
        self.batches = -(-scan.total // batch)
        self._claims = itertools.count()  # next() on a count is atomic under the GIL
        self._lock = threading.Lock()
        self._idle: threading.Condition | None = None  # only when other threads help
        self._closed = False
        self._active = 0
        self.failed: BaseException | None = None
        self.positions: list[Index] = []
        self.scores: list[Matrix] = []

    def share(self, pool: ThreadPoolExecutor, helpers: int) -> list[Future[None]]:
        """Let `helpers` pool threads claim batches too."""
        self._idle = threading.Condition(self._lock)
        return [pool.submit(self.help) for _ in range(helpers)]

    def help(self) -> None:
        """A pool thread's share: nothing if the caller has already finished."""
        with self._lock:
            if self._closed:
                return
            self._active += 1
        try:
            self.work()
        finally:
            with self._lock:
                self._active -= 1
                if self._idle is not None:
                    self._idle.notify_all()

    def finish(self) -> None:
        """After the caller's own share: wait for the batches other threads have claimed."""
        with self._lock:
            self._closed = True
            while self._active and self._idle is not None:
                self._idle.wait()

    def work(self) -> None:
        scan, batch, k = self.scan, self.batch, self.k
        buffer = np.empty(min(batch, scan.total), dtype=np.float32)
        # This thread's best k so far. Once it has k, a batch's rows below its k-th score can
        # never make the top k: one comparison selects the few that can, instead of a
        # partition of the whole batch (tens of microseconds per batch).
        best_positions = np.empty(0, dtype=np.int64)
        best_scores = np.empty(0, dtype=np.float32)
        try:
            while self.failed is None:
                number = next(self._claims)
                if number >= self.batches:
                    break
                self.cancel.check()
                low = number * batch
                high = min(low + batch, scan.total)
                out = buffer[: high - low]
                self._score(low, high, out)
                if len(best_scores) >= k:
                    picked = np.flatnonzero(out >= best_scores.min())
                elif high - low > k and not len(best_scores):
                    picked = np.argpartition(out, high - low - k)[high - low - k :]
                else:
                    picked = np.arange(high - low, dtype=np.int64)
                if len(picked):
                    positions = np.concatenate((best_positions, picked + low))
                    scores = np.concatenate((best_scores, out[picked]))
                    if len(scores) > k:
                        keep = np.argpartition(scores, len(scores) - k)[len(scores) - k :]
                        positions, scores = positions[keep], scores[keep]
                    best_positions, best_scores = positions, scores
                self.count(scan_batches=1, rows_scored=high - low)
                self.cancel.progress()
        except BaseException as exc:
            with self._lock:
                if self.failed is None:
                    self.failed = exc
        finally:
            with self._lock:
                self.positions.append(best_positions)
                self.scores.append(best_scores)

    def _score(self, low: int, high: int, out: Matrix) -> None:
        scan = self.scan
        matrix, query = scan.matrix, self.query
        starts, offsets = scan.start_list, scan.offset_list
        run = bisect.bisect_right(offsets, low) - 1
        at = low
        while at < high:
            stop = min(offsets[run + 1], high)
            first = starts[run] + at - offsets[run]
            dot_rows(matrix[first : first + stop - at], query, out[at - low : stop - low])
            at = stop
            run += 1


# --- the store ------------------------------------------------------------------------------


class Scanner:
    """Runs a store's scans: the caller's thread plus a lazily started pool of scan threads.

    The pool has one thread fewer than the cores this process may use (the caller is the
    last one); `close` stops it, and later scans run on the caller's thread alone.
    """

    def __init__(self, batch: int, count: Count) -> None:
        self._batch = batch
        self._count = count
        self._helpers = usable_cores() - 1
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def scan(self, scan: Scan, query: Matrix, k: int, cancel: CancelToken) -> tuple[Index, Matrix]:
        """Score every captured row; the best `k` of each thread (scan positions, scores).

        A scan of at least `PARALLEL_MIN_ROWS` rows is shared with the store's scan threads
        (one fewer than the cores this process may use; the caller is the last one). The
        caller works too, so a scan never waits for a pool busy with other searches: helpers
        that start late find nothing left and return. A shared scan uses batches small enough
        for every thread to get two or more (never more than `scan_batch_rows` rows, so the
        cancel token is checked at least as often), or the last batches would leave threads
        idle.
        """
        batch = self._batch
        pool = None
        if scan.total >= PARALLEL_MIN_ROWS and scan.total > batch // 2 and self._helpers:
            pool = self._scan_pool()
        if pool is not None:
            threads = self._helpers + 1
            batch = min(batch, max(MIN_SHARED_BATCH_ROWS, -(-scan.total // (2 * threads))))
        job = ScanJob(self._count, scan, query, k, cancel, batch)
        self._count(scans_started=1)
        helpers: list[Future[None]] = []
        if pool is not None and job.batches > 1:
            helpers = job.share(pool, min(self._helpers, job.batches - 1))
        job.work()
        for future in helpers:
            future.cancel()  # not started yet: nothing left for it
        job.finish()
        if job.failed is not None:
            if isinstance(job.failed, RetrievalError):
                self._count(scans_cancelled=1)
            raise job.failed
        if not job.positions:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        return np.concatenate(job.positions), np.concatenate(job.scores)

    def close(self) -> None:
        """Stop the scan threads (scans in progress finish on their callers' threads)."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _scan_pool(self) -> ThreadPoolExecutor | None:
        with self._pool_lock:
            if self._pool is None and self._helpers > 0 and not self._closed:
                self._pool = ThreadPoolExecutor(self._helpers, thread_name_prefix="store-scan")
            return self._pool

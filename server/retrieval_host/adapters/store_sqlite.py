"""The embedded SQLite vector store (SPEC §3.7): durable rows in SQLite, similarity in NumPy.

Durability. Sources and passages live in one SQLite file opened through `apsw` (which bundles
SQLite >= 3.51.3; older builds have a WAL-reset bug that can corrupt a database written by
several connections, so they are refused). The connection runs in WAL mode with
`synchronous=FULL`, foreign keys, `secure_delete` and `trusted_schema=OFF`; every statement is
static SQL with bound values. A source revision is replaced in one `BEGIN IMMEDIATE`
transaction, so a reader (in this process or another) sees the old revision or the new one.

Identity. The file carries `PRAGMA application_id` and `user_version`. A file with another
application id, or with tables but no id, is *refused with `UNSAFE_STORE`* (reason
`unrelated-database`) and left untouched: it belongs to something else, writing our schema into it
would damage it, and retrying cannot help (so not the transient `STORE_UNAVAILABLE`). A newer
schema version is refused the same way (reason `schema-version`).

Search. Vectors are never read from SQLite per query. Each corpus namespace is held in memory
as an append-only float32 matrix whose rows for one source revision are contiguous, with a
source -> row-span index. A query first collects the row spans of the allowed
`(source, revision)` pairs whose metadata match the filters (adjacent spans merge into runs),
then scores only those rows, in place, in batches of `scan_batch_rows`, checking the cancel
token before each batch and keeping the top k of each. A large scan is shared between the
calling thread and the store's scan threads (one per further core), each running a
single-threaded vectorised kernel, so a scan reads its rows once at close to the memory
bandwidth of the machine. A scattered grant that is searched again and again is scored from a
bounded cache of contiguous copies of its rows (`_GrantCache`). The in-memory index is updated
in place after this store's own commits and reloaded per changed source when a per-corpus
generation counter shows that another connection committed.

Concurrency. Writers are serialised by a process-wide lock per database file and, across
processes, by SQLite's own locking (with a busy timeout). A search holds no lock while scoring.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import logging
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NamedTuple

import apsw
import numpy as np
import numpy.typing as npt

from retrieval_host.adapters._fs_safety import check_sidecars, prepare_database_path
from retrieval_host.adapters._rows import stored_source, unit_rows
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.models import JSONScalar, Location
from retrieval_host.core.ports import (
    Candidate,
    CapacityLimits,
    StoredChunk,
    StoredSource,
    Vectors,
)

APPLICATION_ID: Final = 0x52485653  # "RHVS": retrieval-host vector store
SCHEMA_VERSION: Final = 1
MIN_SQLITE_VERSION: Final = (3, 51, 3)
BUSY_TIMEOUT_MS: Final = 10_000
WAL_SIZE_LIMIT_BYTES: Final = 64 * 1024 * 1024
# Scans of fewer rows run on the caller's thread alone: handing work to another thread costs
# tens of microseconds, and a host serving concurrent searches keeps every core busy anyway.
PARALLEL_MIN_ROWS: Final = 32_768
# Rows scored between two cancel checks: 48 MiB of 384-dim vectors, a few milliseconds of
# reading. Fewer, larger batches keep the per-batch bookkeeping (top k, counters) negligible.
DEFAULT_SCAN_BATCH_ROWS: Final = 32_768
# A scan shared between threads is cut into batches of at least this many rows.
MIN_SHARED_BATCH_ROWS: Final = 4096
# Copies of repeatedly searched scattered grants (`_GrantCache`): at most this many bytes.
DEFAULT_GRANT_CACHE_BYTES: Final = 64 * 1024 * 1024
GATHER_MAX_RUN_ROWS: Final = 1024
# Captures (a grant's rows) kept per namespace: at most this many grants, this many sources.
CAPTURES: Final = 64
CAPTURED_SOURCES: Final = 200_000
_TABLES: Final = frozenset({"corpora", "sources", "chunks"})

_SCHEMA: Final = (
    """CREATE TABLE corpora (
        corpus_id TEXT PRIMARY KEY,
        descriptor_json TEXT NOT NULL,
        generation INTEGER NOT NULL DEFAULT 0
    ) STRICT""",
    """CREATE TABLE sources (
        id INTEGER PRIMARY KEY,
        corpus_id TEXT NOT NULL REFERENCES corpora(corpus_id),
        namespace TEXT NOT NULL,
        source_id TEXT NOT NULL,
        revision TEXT NOT NULL,
        title TEXT NOT NULL,
        metadata_json TEXT NOT NULL,
        document_sha256 TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        chunk_count INTEGER NOT NULL,
        payload_bytes INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        UNIQUE (corpus_id, namespace, source_id)
    ) STRICT""",
    """CREATE TABLE chunks (
        source_pk INTEGER NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
        corpus_id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        chunk_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        text TEXT NOT NULL,
        page INTEGER,
        start_line INTEGER,
        end_line INTEGER,
        document_id TEXT,
        vector BLOB NOT NULL,
        UNIQUE (corpus_id, namespace, chunk_id),
        UNIQUE (source_pk, ordinal)
    ) STRICT""",
)

_log = logging.getLogger(__name__)

_Matrix = npt.NDArray[np.float32]
_Index = npt.NDArray[np.int64]

# One lock per database file for the whole process: writers from several store instances on the
# same file queue here instead of spinning in SQLite's busy handler.
_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(path: Path) -> threading.Lock:
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(str(path), threading.Lock())


@dataclass(frozen=True, slots=True)
class StoreCounters:
    """Monotonic scan counters (a snapshot): observe that a cancelled request stopped scanning."""

    scans_started: int = 0
    scan_batches: int = 0
    scans_cancelled: int = 0
    rows_scored: int = 0


def check_sqlite_version(version: str) -> None:
    """Refuse SQLite builds older than 3.51.3 (WAL-reset corruption with several connections)."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        parts = ()
    if parts < MIN_SQLITE_VERSION:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            f"SQLite {version} is too old; the store needs 3.51.3 or newer (use the apsw wheel "
            "that bundles it).",
            reason="sqlite-version",
        )


def _store_error(action: str, exc: apsw.Error) -> RetrievalError:
    # The SQLite message is not rendered to callers (it may name paths or values); it stays
    # attached as the cause for the log.
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database stayed locked by another writer while {action}.",
            reason="busy",
        )
    if isinstance(exc, apsw.NotADBError):
        return RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the store path holds a file that is not a SQLite database.",
            reason="not-a-database",
        )
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE, f"the database failed while {action}.", reason="sqlite-error"
    )


@contextlib.contextmanager
def _translated(action: str) -> Iterator[None]:
    try:
        yield
    except apsw.Error as exc:
        raise _store_error(action, exc) from exc


def _json_kind(value: object) -> str:
    # JSON equality, not Python equality: `true` never equals `1`, numbers compare by value.
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "structured"


def _metadata_matches(metadata: Mapping[str, Any], filters: Mapping[str, JSONScalar]) -> bool:
    for key, wanted in filters.items():
        if key not in metadata:
            return False
        have = metadata[key]
        kind = _json_kind(have)
        if kind == "structured" or kind != _json_kind(wanted) or have != wanted:
            return False
    return True


def _unit_query(query: Vectors, dims: int) -> _Matrix:
    """The query as a new float32 unit vector (the per-search path of `_unit_rows`)."""
    array = np.asarray(query)
    if array.shape != (dims,):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"the query vector must have shape ({dims},), the corpus dimensions.",
            reason="vector-shape",
        )
    unit: _Matrix = array.astype(np.float32)  # a copy: the caller's array is never written
    if not np.isfinite(unit).all():
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, "the query vector must be finite.", reason="vector-values"
        )
    norm = math.sqrt(float(np.dot(unit.astype(np.float64), unit)))
    if norm == 0:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, "the query vector must not be zero.", reason="vector-values"
        )
    unit /= np.float32(norm)
    return unit


def _check_stored(vectors: _Matrix) -> _Matrix:
    """The norms of stored rows, refusing rows no write could have produced."""
    norms: _Matrix = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "a stored vector is not finite or is zero.",
            reason="corrupt-vector",
        )
    return norms


# --- the in-memory index --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Revision:
    """One source revision as the in-memory index knows it (immutable: shared with searches)."""

    source_id: str
    revision: str
    document_sha256: str
    metadata: Mapping[str, Any]
    generation: int


@dataclass(frozen=True, slots=True)
class _Row:
    chunk_id: str
    # UTF-8, decoded only for the k results: a str of non-ASCII text takes 2 or 4 bytes per
    # character in memory, which would double the cache of a corpus with accented text.
    text: bytes
    location: Location
    source: _Revision


class _Span(NamedTuple):
    """A source revision's rows `start` up to `stop` (a tuple: a search's capture reads
    thousands of them, and tuple fields are the cheapest to read)."""

    revision: str
    start: int
    stop: int
    source: _Revision


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A source revision read from SQLite (or just written), ready to enter the index."""

    namespace: str
    source: _Revision
    rows: tuple[tuple[str, bytes, Location], ...]
    unit_vectors: _Matrix


_GrantKey = tuple[int, str, str]  # a grant's size, first and last source


class _Segment:
    """One corpus namespace: an append-only matrix with contiguous rows per source revision.

    Replacing a source appends its rows and drops the old span; the dead rows are only skipped
    (never scored: searches gather live spans) until the matrix is full, when the live rows are
    compacted into a new array. Rows are never written twice in one array, so a search that
    captured an array and a span list keeps reading consistent data without a lock.
    """

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.matrix: _Matrix = np.empty((0, dimensions), dtype=np.float32)
        self.rows: list[_Row] = []
        self.spans: dict[str, _Span] = {}
        self.size = 0
        self.live = 0
        # Grants searched recently, by their size and first and last source, with a copy of
        # the grant and its capture; emptied by any change to the segment.
        self.captures: OrderedDict[_GrantKey, tuple[dict[str, str], _Scan]] = OrderedDict()
        self._captured_sources = 0

    def captured(self, allowed: dict[str, str]) -> tuple[_GrantKey, _Scan | None]:
        """The capture of exactly this grant, if remembered (and the grant's key)."""
        key = (len(allowed), next(iter(allowed)), next(reversed(allowed)))
        entry = self.captures.get(key)
        # A dict comparison (C, no allocation) costs far less than walking the grant again.
        if entry is None or entry[0] != allowed:
            return key, None
        self.captures.move_to_end(key)
        return key, entry[1]

    def remember(self, key: _GrantKey, allowed: dict[str, str], scan: _Scan) -> None:
        """Keep a grant's capture, within `CAPTURES` grants and `CAPTURED_SOURCES` sources."""
        old = self.captures.pop(key, None)
        if old is not None:
            self._captured_sources -= len(old[0])
        self.captures[key] = (dict(allowed), scan)
        self._captured_sources += len(allowed)
        while len(self.captures) > CAPTURES or self._captured_sources > CAPTURED_SOURCES:
            self._captured_sources -= len(self.captures.popitem(last=False)[1][0])

    def _changed(self) -> None:
        self.captures.clear()
        self._captured_sources = 0

    def remove(self, source_id: str) -> None:
        span = self.spans.pop(source_id, None)
        if span is not None:
            self._changed()
            self.live -= span.stop - span.start
            if len(self.matrix) > 4096 and self.live < len(self.matrix) // 4:
                self._compact(0)

    def reserve(self, count: int) -> None:
        """Room for `count` more rows in one allocation (a bulk load grows the matrix once).

        Capacity beyond the rows written costs address space only: pages of a large array that
        were never written are not resident.
        """
        if self.size + count > len(self.matrix):
            self._compact(count)

    def put(self, loaded: _Loaded) -> None:
        self.remove(loaded.source.source_id)
        self._changed()
        count = len(loaded.rows)
        self.reserve(count)
        start = self.size
        self.matrix[start : start + count] = loaded.unit_vectors
        self.rows.extend(_Row(cid, text, loc, loaded.source) for cid, text, loc in loaded.rows)
        self.spans[loaded.source.source_id] = _Span(
            loaded.source.revision, start, start + count, loaded.source
        )
        self.size += count
        self.live += count

    def _compact(self, extra: int) -> None:
        self._changed()
        capacity = max(2 * (self.live + extra), 256)
        matrix = np.empty((capacity, self.dimensions), dtype=np.float32)
        rows: list[_Row] = []
        spans: dict[str, _Span] = {}
        at = 0
        for source_id, span in self.spans.items():
            n = span.stop - span.start
            matrix[at : at + n] = self.matrix[span.start : span.stop]
            rows.extend(self.rows[span.start : span.stop])
            spans[source_id] = span._replace(start=at, stop=at + n)
            at += n
        self.matrix, self.rows, self.spans, self.size = matrix, rows, spans, at


@dataclass
class _CorpusState:
    descriptor: CorpusDescriptor
    segments: dict[str, _Segment]
    generations: dict[tuple[str, str], int]  # (namespace, source_id) -> generation loaded
    loaded_generation: int

    @property
    def dimensions(self) -> int:
        return self.descriptor.embedding.dimensions


@dataclass(frozen=True, slots=True)
class _Scan:
    """What a search captured under the cache lock; scored afterwards without any lock.

    The allowed rows as runs of consecutive matrix rows: run `r` is rows `starts[r]` up to
    `starts[r] + offsets[r + 1] - offsets[r]`, and takes the scan positions `offsets[r]` up to
    `offsets[r + 1]`. Each run is scored in place (a view), never gathered into a copy.
    """

    matrix: _Matrix
    rows: list[_Row]
    starts: _Index
    offsets: _Index
    # The same as Python ints: the per-run loop of a scan indexes them (NumPy scalars cost more).
    start_list: list[int]
    offset_list: list[int]

    @classmethod
    def of(cls, matrix: _Matrix, rows: list[_Row], spans: list[tuple[int, int]]) -> _Scan:
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
    def contiguous(cls, matrix: _Matrix, rows: list[_Row]) -> _Scan:
        """All of `matrix` as one run (a grant's rows gathered in scan order)."""
        total = len(matrix)
        return cls(
            matrix, rows, np.zeros(1, np.int64), np.array([0, total], np.int64), [0], [0, total]
        )

    @property
    def total(self) -> int:
        return self.offset_list[-1]

    def row_index(self) -> _Index:
        """Every matrix row of the scan, in scan order."""
        lengths = np.diff(self.offsets)
        return np.repeat(self.starts - self.offsets[:-1], lengths) + np.arange(
            self.total, dtype=np.int64
        )

    def row_numbers(self, positions: _Index) -> _Index:
        """The matrix rows at these scan positions."""
        run = np.searchsorted(self.offsets, positions, side="right") - 1
        return self.starts[run] + (positions - self.offsets[run])


def _runs(spans: list[tuple[int, int]]) -> tuple[_Index, _Index]:
    """Sorted spans merged where one ends where the next starts: (starts, offsets)."""
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    stops = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    first = np.flatnonzero(np.r_[True, starts[1:] != stops[:-1]])
    last = np.r_[first[1:] - 1, len(spans) - 1]
    run_starts = starts[first]
    offsets = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(stops[last] - run_starts, out=offsets[1:])
    return run_starts, offsets


def _dot_rows(block: _Matrix, query: _Matrix, out: _Matrix) -> None:
    """`out[i] = block[i] . query`, computed in the calling thread only.

    Not a matrix-vector product: OpenBLAS's sgemv hands every call above a few thousand
    elements to its own thread pool, and on a busy machine a scan of many batch-sized calls
    then waits for helper threads that other work has descheduled (measured here: 8192-row
    batches 5-10x slower than one call). `vecdot` takes one vectorised dot product per row
    (too short for BLAS to thread), releases the GIL and costs about a microsecond per call,
    so a scan of many short runs stays cheap and the store alone decides the parallelism.
    """
    np.vecdot(block, query, out=out)


def _scan_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


class _GrantCache:
    """Contiguous copies of the rows of grants that are searched again and again.

    An application usually answers one subject with the same grant many times. When that grant
    is scattered (many short runs of rows), each search scores it with one short kernel call
    per run, all holding the GIL; a copy of its rows in scan order is scored with one call per
    batch that releases it, at the memory bandwidth. A grant is copied the second time it is
    seen (a one-off grant never pays for the copy), if the copy takes at most half the budget;
    least recently used copies go first. Only grants whose runs average fewer than
    `GATHER_MAX_RUN_ROWS` rows are copied: long runs are scored in place just as fast.

    The key is the segment array and the exact runs: rows of one array are never rewritten
    (a changed source gets new rows, a compaction a new array), so a key always names the same
    bytes. Entries hold the array only weakly; a compacted-away array frees its entries.
    """

    SEEN: Final = 256

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._copies: OrderedDict[tuple[int, bytes, bytes], _GrantRows] = OrderedDict()
        self._seen: OrderedDict[tuple[int, bytes, bytes], None] = OrderedDict()
        self._bytes = 0

    def rows(self, scan: _Scan) -> _Matrix | None:
        """The scan's rows as one contiguous array, when cached (or now worth caching)."""
        runs = len(scan.start_list)
        size = scan.total * scan.matrix.shape[1] * scan.matrix.itemsize
        if runs < 2 or scan.total >= runs * GATHER_MAX_RUN_ROWS or 2 * size > self.budget:
            return None
        key = (id(scan.matrix), scan.starts.tobytes(), scan.offsets.tobytes())
        with self._lock:
            entry = self._copies.get(key)
            if entry is not None and entry.matrix() is scan.matrix:
                self._copies.move_to_end(key)
                return entry.rows
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > self.SEEN:
                    self._seen.popitem(last=False)
                return None
        # The copy is made outside the lock (np.take releases the GIL).
        rows: _Matrix = np.take(scan.matrix, scan.row_index(), axis=0)
        with self._lock:
            self._seen.pop(key, None)
            self._insert(key, _GrantRows(weakref.ref(scan.matrix), rows))
        return rows

    def _insert(self, key: tuple[int, bytes, bytes], entry: _GrantRows) -> None:
        old = self._copies.pop(key, None)
        if old is not None:
            self._bytes -= old.rows.nbytes
        for stale in [k for k, e in self._copies.items() if e.matrix() is None]:
            self._bytes -= self._copies.pop(stale).rows.nbytes
        self._copies[key] = entry
        self._bytes += entry.rows.nbytes
        while self._bytes > self.budget and self._copies:
            self._bytes -= self._copies.popitem(last=False)[1].rows.nbytes

    def clear(self) -> None:
        with self._lock:
            self._copies.clear()
            self._seen.clear()
            self._bytes = 0


@dataclass(frozen=True, slots=True)
class _GrantRows:
    matrix: weakref.ref[_Matrix]
    rows: _Matrix


class _ScanJob:
    """One search's scan: batches of scan positions, claimed in order by one or more threads.

    Every thread checks the cancel token before each batch it claims and keeps the best `k`
    of the batches it scored; the caller merges them. After a failure (a cancel) no new
    batch starts.
    """

    def __init__(
        self,
        store: SqliteVectorStore,
        scan: _Scan,
        query: _Matrix,
        k: int,
        cancel: CancelToken,
        batch: int,
    ) -> None:
        self.store = store
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
        self.positions: list[_Index] = []
        self.scores: list[_Matrix] = []

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
                self.store._count(scan_batches=1, rows_scored=high - low)
                self.cancel.progress()
        except BaseException as exc:
            with self._lock:
                if self.failed is None:
                    self.failed = exc
        finally:
            with self._lock:
                self.positions.append(best_positions)
                self.scores.append(best_scores)

    def _score(self, low: int, high: int, out: _Matrix) -> None:
        scan = self.scan
        matrix, query = scan.matrix, self.query
        starts, offsets = scan.start_list, scan.offset_list
        run = bisect.bisect_right(offsets, low) - 1
        at = low
        while at < high:
            stop = min(offsets[run + 1], high)
            first = starts[run] + at - offsets[run]
            _dot_rows(matrix[first : first + stop - at], query, out[at - low : stop - low])
            at = stop
            run += 1


# --- the store ------------------------------------------------------------------------------


class SqliteVectorStore:
    """The embedded vector store (implements `core.ports.VectorStore`); create with `open()`.

    Thread-safe: the service calls it from a thread pool. One SQLite connection per instance,
    used under a lock, plus one read-only connection per searching thread for the freshness
    check; searches score outside every lock.
    """

    def __init__(
        self,
        connection: apsw.Connection,
        path: Path,
        scan_batch_rows: int,
        grant_cache_bytes: int = DEFAULT_GRANT_CACHE_BYTES,
    ) -> None:
        """Private: use `SqliteVectorStore.open(path)`, which checks and prepares the file."""
        self._conn: apsw.Connection | None = connection
        self._path = path
        self._batch = scan_batch_rows
        self._write_lock = _path_lock(path)
        self._db_lock = threading.RLock()
        self._cache_lock = threading.Lock()
        self._counter_lock = threading.Lock()
        self._counters = StoreCounters()
        self._corpora: dict[str, _CorpusState] = {}
        self._helpers = _scan_threads() - 1
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._grants = _GrantCache(grant_cache_bytes)
        # Per-thread read-only connections for the freshness check of every search.
        self._readers = threading.local()
        self._reader_lock = threading.Lock()
        self._reader_conns: list[apsw.Connection] = []

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        scan_batch_rows: int = DEFAULT_SCAN_BATCH_ROWS,
        grant_cache_bytes: int = DEFAULT_GRANT_CACHE_BYTES,
    ) -> SqliteVectorStore:
        """Open (creating if missing) the store at `path` after the private-location checks.

        `grant_cache_bytes` bounds the copies of repeatedly searched, scattered grants (see
        `_GrantCache`); 0 turns the cache off.

        Raises `UNSAFE_STORE` for an unsafe location, an unrelated or newer database, or a
        SQLite build older than 3.51.3; `STORE_UNAVAILABLE` when SQLite cannot open the file.
        """
        if isinstance(scan_batch_rows, bool) or scan_batch_rows < 1:
            raise ValueError("scan_batch_rows must be a positive integer")
        if isinstance(grant_cache_bytes, bool) or grant_cache_bytes < 0:
            raise ValueError("grant_cache_bytes must be a non-negative integer")
        check_sqlite_version(apsw.sqlite_lib_version())
        database = prepare_database_path(path)
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW
        with _translated("opening the store"):
            conn = apsw.Connection(str(database), flags=flags)
        try:
            with _translated("opening the store"):
                conn.set_busy_timeout(BUSY_TIMEOUT_MS)
                # Before anything writes: a schema in the file must not run our functions.
                conn.execute("PRAGMA trusted_schema=OFF")
                conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
                fresh = _check_identity(conn)
                _configure(conn)
                if fresh:
                    _create_schema(conn)
            check_sidecars(database)  # SQLite created them just now: same checks
        except BaseException:
            conn.close()
            raise
        return cls(conn, database, scan_batch_rows, grant_cache_bytes)

    def __enter__(self) -> SqliteVectorStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def reclamation(self) -> str:
        """`overwritten`: `secure_delete` zeroes freed pages and deletes checkpoint the WAL."""
        return "overwritten"

    @property
    def counters(self) -> StoreCounters:
        """A snapshot of the scan counters (they only ever increase)."""
        with self._counter_lock:
            return self._counters

    def close(self) -> None:
        """Close the connection; later calls raise `STORE_UNAVAILABLE`. Idempotent."""
        with self._db_lock:
            with self._reader_lock:
                for reader in self._reader_conns:
                    reader.close()
                self._reader_conns.clear()
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
            with self._cache_lock:
                self._corpora.clear()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._grants.clear()

    # --- corpora -----------------------------------------------------------------------------

    def open_corpus(self, descriptor: CorpusDescriptor) -> None:
        """Store the descriptor on first use; `DESCRIPTOR_MISMATCH` if it differs later."""
        canonical = descriptor.canonical_json()
        with self._write_lock, self._db_lock:
            conn = self._connection()
            with _translated("opening a corpus"), _immediate(conn):
                row = conn.execute(
                    "SELECT descriptor_json FROM corpora WHERE corpus_id = ?",
                    (descriptor.corpus_id,),
                ).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO corpora (corpus_id, descriptor_json) VALUES (?, ?)",
                        (descriptor.corpus_id, canonical),
                    )
                elif row[0] != canonical:
                    differing = descriptor.mismatch(str(row[0]))
                    if differing:
                        raise RetrievalError(
                            ErrorCode.DESCRIPTOR_MISMATCH,
                            f"corpus {descriptor.corpus_id!r} was built with a different "
                            f"descriptor; differing fields: {', '.join(differing)}.",
                        )
        # Loading the vectors can take a while on a big corpus: other writers need not wait.
        with self._db_lock:
            state = self._corpora.get(descriptor.corpus_id)
            if state is None or state.descriptor != descriptor:
                state = _CorpusState(descriptor, {}, {}, -1)
                with self._cache_lock:
                    self._corpora[descriptor.corpus_id] = state
            self._refresh(state)

    # --- reads -------------------------------------------------------------------------------

    def get_source(self, corpus: str, namespace: str, source_id: str) -> StoredSource | None:
        """The current revision of a source, read from SQLite (authoritative), or None."""
        with self._db_lock, _translated("reading a source"):
            row = (
                self._connection()
                .execute(
                    "SELECT source_id, revision, title, metadata_json, document_sha256, "
                    "fingerprint, chunk_count FROM sources "
                    "WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
                    (corpus, namespace, source_id),
                )
                .fetchone()
            )
        if row is None:
            return None
        return stored_source(row)

    def current_revisions(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None = None
    ) -> dict[str, str]:
        """Source id -> committed current revision in one namespace (see the port).

        Answered from the in-memory index after the same freshness check a search makes (one
        row read on this thread's own connection; a commit by another connection or process
        is loaded first), so an authorizer can call it on every request.
        """
        state = self._state(corpus)
        self._ensure_fresh(state)
        with self._cache_lock:
            segment = state.segments.get(namespace)
            if segment is None:
                return {}
            spans = segment.spans
            if source_ids is None:
                return {sid: span.revision for sid, span in spans.items()}
            get = spans.get
            return {sid: span.revision for sid in source_ids if (span := get(sid)) is not None}

    # --- writes ------------------------------------------------------------------------------

    def replace_source(
        self,
        corpus: str,
        namespace: str,
        source: StoredSource,
        chunks: Sequence[StoredChunk],
        *,
        expected_revision: str | None,
        limits: CapacityLimits,
    ) -> None:
        """Swap in one whole revision in one IMMEDIATE transaction (see the port's contract)."""
        state = self._state(corpus)
        if source.chunk_count != len(chunks):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST, "chunk_count must equal the number of chunks."
            )
        chunk_ids = [c.chunk_id for c in chunks]
        if len(set(chunk_ids)) != len(chunk_ids) or len({c.ordinal for c in chunks}) != len(chunks):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                "chunk ids and ordinals must be unique within a source.",
            )
        raw = self._vectors(state, [c.vector for c in chunks], "passage vectors")
        unit = unit_rows(raw, "passage vectors")
        blobs = [row.astype("<f4").tobytes() for row in raw]
        payload = sum(len(c.text.encode("utf-8")) for c in chunks) + sum(map(len, blobs))
        metadata_json = json.dumps(
            source.metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        key = (corpus, namespace, source.source_id)

        with self._write_lock, self._db_lock:
            conn = self._connection()
            with _translated("replacing a source"), _immediate(conn):
                current_pk = _check_replacement(
                    conn, key, expected_revision, chunk_ids, payload, limits
                )
                before, generation = _bump_generation(conn, corpus)
                if current_pk is not None:
                    conn.execute("DELETE FROM sources WHERE id = ?", (current_pk,))
                source_pk = _one(
                    conn.execute(
                        "INSERT INTO sources (corpus_id, namespace, source_id, revision, "
                        "title, metadata_json, document_sha256, fingerprint, chunk_count, "
                        "payload_bytes, generation) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                        (
                            *key,
                            source.revision,
                            source.title,
                            metadata_json,
                            source.document_sha256,
                            source.fingerprint,
                            len(chunks),
                            payload,
                            generation,
                        ),
                    )
                )[0]
                conn.executemany(
                    "INSERT INTO chunks (source_pk, corpus_id, namespace, chunk_id, "
                    "ordinal, text, page, start_line, end_line, document_id, vector) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            source_pk,
                            corpus,
                            namespace,
                            c.chunk_id,
                            c.ordinal,
                            c.text,
                            c.location.page,
                            c.location.start_line,
                            c.location.end_line,
                            c.location.document_id,
                            blob,
                        )
                        for c, blob in zip(chunks, blobs, strict=True)
                    ],
                )
            # Chunks enter the index in ordinal order, the order a reload reads them back in.
            order = sorted(range(len(chunks)), key=lambda i: chunks[i].ordinal)
            loaded = _Loaded(
                namespace,
                _Revision(
                    source.source_id,
                    source.revision,
                    source.document_sha256,
                    json.loads(metadata_json),
                    generation,
                ),
                tuple(
                    (chunks[i].chunk_id, chunks[i].text.encode("utf-8"), chunks[i].location)
                    for i in order
                ),
                unit[order],
            )
            self._after_commit(state, before, generation, [loaded], [])

    def delete_source(self, corpus: str, namespace: str, source_id: str, revision: str) -> int:
        """Delete exactly that revision; `SOURCE_UNAVAILABLE` if absent, `SOURCE_CONFLICT` if
        the source is at another revision. Returns the number of passages removed."""
        state = self._state(corpus)
        with self._write_lock, self._db_lock:
            conn = self._connection()
            with _translated("deleting a source"), _immediate(conn):
                current = conn.execute(
                    "SELECT id, revision FROM sources "
                    "WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
                    (corpus, namespace, source_id),
                ).fetchone()
                if current is None:
                    raise source_unavailable()
                if str(current[1]) != revision:
                    raise RetrievalError(
                        ErrorCode.SOURCE_CONFLICT,
                        "the source is at another revision; delete names the exact current "
                        "revision.",
                        reason="stale-revision",
                    )
                removed = int(
                    _one(
                        conn.execute(
                            "SELECT COUNT(*) FROM chunks WHERE source_pk = ?", (current[0],)
                        )
                    )[0]
                )
                before, generation = _bump_generation(conn, corpus)
                conn.execute("DELETE FROM sources WHERE id = ?", (current[0],))
            self._after_commit(state, before, generation, [], [(namespace, source_id)])
            _truncate_wal(conn)
        return removed

    # --- search ------------------------------------------------------------------------------

    def search(
        self,
        corpus: str,
        namespace: str,
        allowed: Mapping[str, str],
        query: Vectors,
        k: int,
        cancel: CancelToken,
        filters: Mapping[str, JSONScalar] | None = None,
    ) -> list[Candidate]:
        """Top-k cosine matches among the allowed revisions only, best first.

        Rows outside `allowed` (or the namespace, or the filters) never enter the similarity
        product. `cancel` is checked before each batch of at most `scan_batch_rows` rows.
        """
        state = self._state(corpus)
        unit_query = _unit_query(query, state.dimensions)
        if k <= 0 or not allowed:
            return []
        self._ensure_fresh(state)
        scan = self._capture(state, namespace, allowed, filters)
        if scan is None:
            return []
        gathered = self._grants.rows(scan)
        scored = scan if gathered is None else _Scan.contiguous(gathered, scan.rows)
        positions, scores = self._scan(scored, unit_query, k, cancel)
        rows = scan.row_numbers(positions)
        # Best first; equal scores in row order, so results are deterministic.
        top = np.lexsort((rows, -scores))[:k]
        results: list[Candidate] = []
        for i in top:
            row = scan.rows[int(rows[i])]
            results.append(
                Candidate(
                    chunk_id=row.chunk_id,
                    source_id=row.source.source_id,
                    revision=row.source.revision,
                    text=row.text.decode("utf-8"),
                    location=row.location,
                    document_sha256=row.source.document_sha256,
                    score=min(1.0, max(-1.0, float(scores[i]))),
                )
            )
        return results

    def _capture(
        self,
        state: _CorpusState,
        namespace: str,
        allowed: Mapping[str, str],
        filters: Mapping[str, JSONScalar] | None,
    ) -> _Scan | None:
        with self._cache_lock:
            segment = state.segments.get(namespace)
            if segment is None:
                return None
            # The same grant again (an application asks for one subject many times): its
            # capture is kept until the segment changes. Not for filtered searches, nor for a
            # grant much larger than the namespace (comparing it would cost more than the walk).
            index = segment.spans
            key = None
            grant = allowed if isinstance(allowed, dict) else None
            if not filters and grant is not None and len(grant) <= 2 * len(index) + 64:
                key, scan = segment.captured(grant)
                if scan is not None:
                    return scan
            # Walk the smaller side: the grant or the namespace's sources.
            if len(allowed) <= len(index):
                get = index.get
                hits = [
                    span
                    for sid, revision in allowed.items()
                    if (span := get(sid)) is not None and span.revision == revision
                ]
            else:
                granted = allowed.get
                hits = [span for sid, span in index.items() if granted(sid) == span.revision]
            if filters:
                hits = [s for s in hits if _metadata_matches(s.source.metadata, filters)]
            spans = [(s.start, s.stop) for s in hits if s.stop > s.start]
            if not spans:
                return None
            scan = _Scan.of(segment.matrix, segment.rows, spans)
            if key is not None and grant is not None:
                segment.remember(key, grant, scan)
            return scan

    def _scan(
        self, scan: _Scan, query: _Matrix, k: int, cancel: CancelToken
    ) -> tuple[_Index, _Matrix]:
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
        job = _ScanJob(self, scan, query, k, cancel, batch)
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

    def _scan_pool(self) -> ThreadPoolExecutor | None:
        with self._pool_lock:
            if self._pool is None and self._helpers > 0 and self._conn is not None:
                self._pool = ThreadPoolExecutor(self._helpers, thread_name_prefix="store-scan")
            return self._pool

    def _count(
        self,
        *,
        scans_started: int = 0,
        scan_batches: int = 0,
        scans_cancelled: int = 0,
        rows_scored: int = 0,
    ) -> None:
        with self._counter_lock:
            c = self._counters
            self._counters = StoreCounters(
                c.scans_started + scans_started,
                c.scan_batches + scan_batches,
                c.scans_cancelled + scans_cancelled,
                c.rows_scored + rows_scored,
            )

    # --- cache maintenance ---------------------------------------------------------------------

    def _ensure_fresh(self, state: _CorpusState) -> None:
        """Reload what other connections committed since the cache was last brought up to date.

        The generation is read on the calling thread's own read-only connection, outside the
        store's lock: with one shared connection, concurrent searches queued on its lock
        (each holder also waiting for the GIL to come back from SQLite). Only a changed
        generation takes the lock, and checks again on the main connection before reloading.
        """
        corpus = state.descriptor.corpus_id
        if _generation(self._reader(), corpus) == state.loaded_generation:
            return
        with self._db_lock:
            if _generation(self._connection(), corpus) != state.loaded_generation:
                self._refresh(state)

    def _reader(self) -> apsw.Connection:
        """This thread's read-only connection to the store (opened on first use)."""
        conn: apsw.Connection | None = getattr(self._readers, "conn", None)
        if conn is not None:
            return conn
        with self._reader_lock:
            if self._conn is None:
                self._connection()  # raises: the store is closed
            flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW
            conn = apsw.Connection(str(self._path), flags=flags)
            try:
                conn.set_busy_timeout(BUSY_TIMEOUT_MS)
                conn.execute("PRAGMA trusted_schema=OFF")
                conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
            except BaseException:
                conn.close()
                raise
            self._reader_conns.append(conn)
        self._readers.conn = conn
        return conn

    def _after_commit(
        self,
        state: _CorpusState,
        before: int,
        generation: int,
        loaded: list[_Loaded],
        removed: list[tuple[str, str]],
    ) -> None:
        # Caller holds the db lock. Apply our own change directly only when the cache was
        # exactly at the generation our transaction started from; otherwise another
        # connection committed in between and the cache reloads what changed.
        if state.loaded_generation == before:
            with self._cache_lock:
                self._apply(state, loaded, removed)
                state.loaded_generation = generation
            return
        try:
            self._refresh(state)
        except RetrievalError:
            # The write is committed: failing it now would invite a retry of a done mutation.
            # The next search retries the reload instead.
            state.loaded_generation = -1
            _log.warning("cache reload after a commit failed; retried on the next search")

    def _refresh(self, state: _CorpusState) -> None:
        """Bring one corpus's cache up to date from SQLite, loading only changed sources.

        Caller holds the db lock. The listing and the loads share one read transaction, so the
        cache moves from one committed state to another.
        """
        corpus = state.descriptor.corpus_id
        conn = self._connection()
        with _translated("loading the corpus"), _transaction(conn, "BEGIN"):
            row = conn.execute(
                "SELECT generation FROM corpora WHERE corpus_id = ?", (corpus,)
            ).fetchone()
            generation = int(row[0]) if row is not None else 0
            listing = {
                (str(ns), str(sid)): (int(pk), int(gen), int(count))
                for pk, ns, sid, gen, count in conn.execute(
                    "SELECT id, namespace, source_id, generation, chunk_count FROM sources "
                    "WHERE corpus_id = ?",
                    (corpus,),
                )
            }
            removed = [key for key in state.generations if key not in listing]
            changed = [
                (pk, count)
                for key, (pk, gen, count) in listing.items()
                if state.generations.get(key) != gen
            ]
            # One staging array for all the loaded vectors, freed whole once they are copied
            # into the index: thousands of small per-source arrays interleaved with the
            # passages' long-lived strings would leave the heap fragmented, resident for good.
            staging = np.empty((sum(c for _, c in changed), state.dimensions), dtype=np.float32)
            loaded: list[_Loaded] = []
            at = 0
            for pk, count in changed:
                loaded.append(self._load(conn, state, pk, staging[at : at + count]))
                at += count
        with self._cache_lock:
            self._apply(state, loaded, removed)
            state.loaded_generation = generation

    def _load(
        self, conn: apsw.Connection, state: _CorpusState, source_pk: int, out: _Matrix
    ) -> _Loaded:
        """One source revision, its unit vectors written into `out` (a slice of staging)."""
        row = _one(
            conn.execute(
                "SELECT namespace, source_id, revision, document_sha256, metadata_json, "
                "generation FROM sources WHERE id = ?",
                (source_pk,),
            )
        )
        chunks: list[tuple[Any, ...]] = conn.execute(
            "SELECT chunk_id, CAST(text AS BLOB), page, start_line, end_line, document_id, "
            "vector FROM chunks WHERE source_pk = ? ORDER BY ordinal",
            (source_pk,),
        ).fetchall()
        width = state.dimensions * 4
        if len(chunks) != len(out) or any(len(c[6]) != width for c in chunks):
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "a stored vector does not have the corpus dimensions.",
                reason="corrupt-vector",
            )
        if chunks:
            out[:] = np.frombuffer(b"".join(c[6] for c in chunks), dtype="<f4").reshape(
                len(chunks), -1
            )
            out /= _check_stored(out)  # our own staging rows, normalised in place
        rows = tuple((str(c[0]), bytes(c[1]), Location(c[2], c[3], c[4], c[5])) for c in chunks)
        return _Loaded(
            str(row[0]),
            _Revision(str(row[1]), str(row[2]), str(row[3]), json.loads(str(row[4])), int(row[5])),
            rows,
            out,
        )

    def _apply(
        self, state: _CorpusState, loaded: list[_Loaded], removed: list[tuple[str, str]]
    ) -> None:
        # Caller holds the cache lock.
        for namespace, source_id in removed:
            segment = state.segments.get(namespace)
            if segment is not None:
                segment.remove(source_id)
            state.generations.pop((namespace, source_id), None)
        incoming: dict[str, int] = {}
        for item in loaded:
            incoming[item.namespace] = incoming.get(item.namespace, 0) + len(item.rows)
        for namespace, count in incoming.items():
            segment = state.segments.get(namespace)
            if segment is None:
                segment = state.segments[namespace] = _Segment(state.dimensions)
            segment.reserve(count)
        for item in loaded:
            state.segments[item.namespace].put(item)
            state.generations[(item.namespace, item.source.source_id)] = item.source.generation

    # --- helpers -------------------------------------------------------------------------------

    def _connection(self) -> apsw.Connection:
        if self._conn is None:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE, "the store is closed.", reason="closed"
            )
        return self._conn

    def _state(self, corpus: str) -> _CorpusState:
        with self._cache_lock:
            state = self._corpora.get(corpus)
        if state is None:
            self._connection()  # a closed store says so first
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"corpus {corpus!r} has not been opened on this store.",
                reason="corpus-not-open",
            )
        return state

    @staticmethod
    def _vectors(state: _CorpusState, vectors: Sequence[Vectors], what: str) -> _Matrix:
        dims = state.dimensions
        if not vectors:
            return np.empty((0, dims), dtype=np.float32)
        arrays = [np.asarray(v) for v in vectors]
        if any(a.shape != (dims,) for a in arrays):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"{what} must have shape ({dims},), the corpus dimensions.",
                reason="vector-shape",
            )
        # np.stack copies: the caller's arrays are never written to.
        return np.stack(arrays).astype(np.float32, copy=False)


def _one(cursor: apsw.Cursor) -> tuple[Any, ...]:
    row = cursor.fetchone()
    if row is None:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE, "the database returned no row.", reason="sqlite-error"
        )
    return tuple(row)


def _generation(conn: apsw.Connection, corpus: str) -> int | None:
    """The corpus's committed generation (None when it has no row), read to the end so that
    no read transaction stays open."""
    with _translated("reading the corpus generation"):
        rows = conn.execute(
            "SELECT generation FROM corpora WHERE corpus_id = ?", (corpus,)
        ).fetchall()
    value = rows[0][0] if rows else None
    return value if isinstance(value, int) else None


@contextlib.contextmanager
def _transaction(conn: apsw.Connection, begin: str) -> Iterator[None]:
    """Run the block in one transaction: COMMIT at the end, ROLLBACK on any exception."""
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _immediate(conn: apsw.Connection) -> contextlib.AbstractContextManager[None]:
    # IMMEDIATE takes the write lock up front: a read-then-write transaction can never find
    # its snapshot stale at the first write (SQLITE_BUSY_SNAPSHOT, which skips the busy wait).
    return _transaction(conn, "BEGIN IMMEDIATE")


def _check_replacement(
    conn: apsw.Connection,
    key: tuple[str, str, str],
    expected_revision: str | None,
    chunk_ids: list[str],
    payload: int,
    limits: CapacityLimits,
) -> int | None:
    """The checks of `replace_source`, inside its transaction; returns the current row id."""
    corpus, namespace, _ = key
    current = conn.execute(
        "SELECT id, revision FROM sources WHERE corpus_id = ? AND namespace = ? AND source_id = ?",
        key,
    ).fetchone()
    current_pk = int(current[0]) if current is not None else None
    if (str(current[1]) if current is not None else None) != expected_revision:
        raise RetrievalError(
            ErrorCode.SOURCE_CONFLICT,
            "another writer changed this source first; read it again and retry if the change "
            "still applies.",
            reason="concurrent-writer",
        )
    taken = conn.execute(
        "SELECT 1 FROM chunks WHERE corpus_id = ? AND namespace = ? AND source_pk IS NOT ? "
        "AND chunk_id IN (SELECT value FROM json_each(?)) LIMIT 1",
        (corpus, namespace, current_pk, json.dumps(chunk_ids)),
    ).fetchone()
    if taken is not None:
        raise RetrievalError(
            ErrorCode.CHUNK_ID_CONFLICT,
            "a chunk id of this revision is already used by another source in this namespace.",
        )
    used = _one(
        conn.execute(
            "SELECT COALESCE(SUM(payload_bytes), 0) FROM sources "
            "WHERE corpus_id = ? AND id IS NOT ?",
            (corpus, current_pk),
        )
    )[0]
    if int(used) + payload > limits.max_corpus_payload_bytes:
        raise RetrievalError(
            ErrorCode.CAPACITY_EXCEEDED,
            f"the corpus may hold at most {limits.max_corpus_payload_bytes} bytes of passages "
            "and vectors.",
            reason="corpus-payload",
        )
    return current_pk


def _truncate_wal(conn: apsw.Connection) -> None:
    """Fold the WAL into the database and truncate it, so deleted rows' old frames go too.

    secure_delete has zeroed the freed pages in the database, but the WAL still holds earlier
    frames with the deleted content. Best effort, never an error (the delete is committed): a
    reader in another process can keep the WAL in use, and then the next checkpoint overwrites
    those frames. A short busy timeout keeps a delete from waiting on such a reader for long.
    """
    conn.set_busy_timeout(250)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except apsw.Error:
        _log.info("WAL checkpoint after a delete was deferred")
    finally:
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)


def _rollback(conn: apsw.Connection) -> None:
    # SQLite may already have rolled back (e.g. on a full disk); ROLLBACK would then fail.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _bump_generation(conn: apsw.Connection, corpus: str) -> tuple[int, int]:
    row = conn.execute(
        "UPDATE corpora SET generation = generation + 1 WHERE corpus_id = ? RETURNING generation",
        (corpus,),
    ).fetchone()
    if row is None:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"corpus {corpus!r} is missing from the database.",
            reason="corpus-missing",
        )
    generation = int(row[0])
    return generation - 1, generation


def _check_identity(conn: apsw.Connection) -> bool:
    """True for an empty database; raises for anything that is not ours. Reads only."""
    application_id = int(_one(conn.execute("PRAGMA application_id"))[0])
    user_version = int(_one(conn.execute("PRAGMA user_version"))[0])
    names = {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        )
    }
    if application_id == 0 and user_version == 0 and not names:
        return True
    if application_id != APPLICATION_ID:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the file at the store path is a SQLite database of another application (other "
            "tables or another application id); point the store at its own private file.",
            reason="unrelated-database",
        )
    if user_version != SCHEMA_VERSION:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            f"the store has schema version {user_version}; this host reads version "
            f"{SCHEMA_VERSION}.",
            reason="schema-version",
        )
    if not names >= _TABLES:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the store's schema is incomplete; it was not written by this host.",
            reason="unrelated-database",
        )
    return False


def _configure(conn: apsw.Connection) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the store could not switch to WAL mode.",
            reason="journal-mode",
        )
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA secure_delete=ON")
    # After a checkpoint, a WAL grown by a burst of writes is cut back to this size.
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    checks = {
        "synchronous": 2,
        "foreign_keys": 1,
        "secure_delete": 1,
    }
    for pragma, wanted in checks.items():
        value = conn.execute(f"PRAGMA {pragma}").fetchone()  # static names from the dict above
        if value is None or int(value[0]) != wanted:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"the store could not set PRAGMA {pragma}.",
                reason="pragma",
            )


def _create_schema(conn: apsw.Connection) -> None:
    with _immediate(conn):
        # Another process may have created it between our check and the write lock.
        if not _check_identity(conn):
            return
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")  # constants, not input
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

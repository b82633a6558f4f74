"""The in-memory index of the SQLite store: one append-only segment per corpus namespace.

Vectors are never read from SQLite per query. Each corpus namespace is held in memory as an
append-only float32 matrix whose rows for one source revision are contiguous, with a
source -> row-span index. A search captures the row spans of the allowed `(source, revision)`
pairs whose metadata match the filters (adjacent spans merge into runs, see `scan.Scan`) and
scores them outside every lock. The index is updated in place after the store's own commits
and reloaded per changed source when a per-corpus generation counter shows that another
connection committed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.lexicon import Granted, LexicalCapture, Lexicon
from retrieval_host.adapters.sqlite.rows import Revision, Row, Rows, chunk_hash
from retrieval_host.adapters.sqlite.scan import Hashes, Index, Matrix, Scan, find_rows
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.filters import MetadataFilter, matches
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate

if TYPE_CHECKING:
    from retrieval_host.adapters.sqlite.approximate import Graph
    from retrieval_host.adapters.sqlite.graph_file import Origin

__all__ = ["CorpusState", "Loaded", "Revision", "Row", "Segment", "Span", "Verdicts", "decide"]

# Captures (a grant's rows) kept per namespace: at most this many grants, this many sources.
CAPTURES: Final = 64
CAPTURED_SOURCES: Final = 200_000
# A segment of more rows than this is compacted when fewer than a quarter of them are live.
COMPACT_MIN_ROWS: Final = 4096
# Filtered grants whose hits a segment keeps (`Segment._filtered`).
FILTERED: Final = 4
# Revisions whose filter verdicts `decide` reaches between two checks of the cancel token.
DECIDE_BATCH: Final = 64


class Span(NamedTuple):
    """A source revision's rows `start` up to `stop` (a tuple: a search's capture reads
    thousands of them, and tuple fields are the cheapest to read)."""

    revision: str
    start: int
    stop: int
    source: Revision


@dataclass(frozen=True, slots=True)
class Loaded:
    """A source revision read from SQLite (or just written), ready to enter the index."""

    namespace: str
    source: Revision
    rows: tuple[tuple[str, bytes, Location], ...]
    unit_vectors: Matrix
    terms: tuple[Mapping[str, int], ...]  # each row's term frequencies (`core.lexical`)


GrantKey = tuple[int, str, str]  # a grant's size, first and last source
# A filter's verdict per source revision, by the revision object's identity (the object is
# kept in the value, so its id is not reused while the verdict is).
Verdicts = dict[int, tuple[Revision, bool]]


class Segment:
    """One corpus namespace: an append-only matrix with contiguous rows per source revision,
    the passages' columns (`rows.Rows`) and the lexical index (`lexicon.Lexicon`), all
    numbered by the same rows.

    Replacing a source appends its rows and drops the old span; the dead rows are only skipped
    (never scored: searches gather live spans) until the matrix is full, when the live rows are
    compacted into new arrays. Rows are never written twice in one array, so a search that
    captured an array and a span list keeps reading consistent data without a lock.
    """

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.matrix: Matrix = np.empty((0, dimensions), dtype=np.float32)
        # Each row's chunk id hashed (`rows.chunk_hash`): finds a passage's row among its
        # source's rows without a Python loop (`locate`).
        self.hashes: Hashes = np.empty(0, dtype=np.int64)
        self.rows = Rows()
        self.lexicon = Lexicon()
        self.spans: dict[str, Span] = {}
        self.size = 0
        self.live = 0
        # Grants searched recently, by their size and first and last source, with a copy of
        # the grant and its capture; emptied by any change to the segment.
        self.captures: OrderedDict[GrantKey, tuple[dict[str, str], Scan]] = OrderedDict()
        self._captured_sources = 0
        # The last `FILTERED` filtered grants' hits, with the grant and filter objects they
        # were found for (compared by identity, kept alive here): one search asks for them up
        # to three times per read (dense, lexical, the convex completion), and hybrid may read
        # again deeper, while a filter of 256 conditions over 10,000 sources costs seconds
        # (probe Q, session 41: 13.5 s of CPU per hybrid search). Several, as concurrent
        # filtered searches interleave (each evaluates outside the cache lock). Emptied by any
        # change to the segment.
        self._filtered: list[tuple[Mapping[str, str], MetadataFilter, list[Span]]] = []
        # The approximate search graph of this array's rows (`approximate`), and whether a
        # build of one is under way.
        self.graph: Graph | None = None
        self.graph_requested = False
        self.graph_retry_at = 0.0  # monotonic time: another process is building the shared one
        # Set when the rows were mapped from an index snapshot: its graph file (`graph_file`).
        self.origin: Origin | None = None

    def adopt(self, graph: Graph) -> None:
        """Use a graph built from rows of the current array (under the cache lock): its
        members that died during the build count as dead."""
        live = sum(_rows_below(s, graph.built) for s in self.spans.values())
        graph.dead = graph.members - live
        self.graph = graph

    def captured(self, allowed: dict[str, str]) -> tuple[GrantKey, Scan | None]:
        """The capture of exactly this grant, if remembered (and the grant's key)."""
        key = (len(allowed), next(iter(allowed)), next(reversed(allowed)))
        entry = self.captures.get(key)
        # A dict comparison (C, no allocation) costs far less than walking the grant again.
        if entry is None or entry[0] != allowed:
            return key, None
        self.captures.move_to_end(key)
        return key, entry[1]

    def remember(self, key: GrantKey, allowed: dict[str, str], scan: Scan) -> None:
        """Keep a grant's capture, within `CAPTURES` grants and `CAPTURED_SOURCES` sources."""
        old = self.captures.pop(key, None)
        if old is not None:
            self._captured_sources -= len(old[0])
        self.captures[key] = (dict(allowed), scan)
        self._captured_sources += len(allowed)
        while len(self.captures) > CAPTURES or self._captured_sources > CAPTURED_SOURCES:
            self._captured_sources -= len(self.captures.popitem(last=False)[1][0])

    def _changed(self) -> None:
        self._filtered.clear()
        self.captures.clear()
        self._captured_sources = 0
        self.lexicon.masks.clear()

    def apply(self, removed: Sequence[str], loaded: Sequence[Loaded]) -> None:
        """Drop `removed` sources and put `loaded` revisions, replacing their sources (the
        caller holds the store's cache lock)."""
        self._changed()
        self.lexicon.begin(len(self.matrix))
        latest = {item.source.source_id: item for item in loaded}  # one revision per source
        for source_id in (*removed, *latest):
            span = self.spans.pop(source_id, None)
            if span is not None:
                self.live -= span.stop - span.start
                self.lexicon.drop(span.start, span.stop)
                if self.graph is not None:
                    self.graph.dead += _rows_below(span, self.graph.built)
        count = sum(len(item.rows) for item in latest.values())
        if self.size + count > len(self.matrix) or (
            len(self.matrix) > COMPACT_MIN_ROWS and self.live < len(self.matrix) // 4
        ):
            self._compact(count)
        start = self.size
        for item in latest.values():
            n = len(item.rows)
            self.matrix[start : start + n] = item.unit_vectors
            self.spans[item.source.source_id] = Span(
                item.source.revision, start, start + n, item.source
            )
            self.rows.append(item.source, item.rows)
            start += n
        self.hashes[self.size : start] = [
            chunk_hash(cid) for item in latest.values() for cid, _, _ in item.rows
        ]
        self.lexicon.add(self.size, [terms for item in latest.values() for terms in item.terms])
        self.live += start - self.size
        self.size = start

    def _compact(self, extra: int) -> None:
        """Move the live rows into new arrays with room for `extra` more (in row order, so
        the lexicon's postings stay sorted)."""
        self._changed()
        capacity = max(2 * (self.live + extra), 256)
        ordered = sorted(self.spans.items(), key=lambda item: item[1].start)
        kept: Index = (
            np.concatenate([np.arange(s.start, s.stop, dtype=np.int64) for _, s in ordered])
            if ordered
            else np.empty(0, np.int64)
        )
        matrix = np.empty((capacity, self.dimensions), dtype=np.float32)
        np.take(self.matrix, kept, axis=0, out=matrix[: len(kept)])
        hashes: Hashes = np.empty(capacity, dtype=np.int64)
        hashes[: len(kept)] = self.hashes[kept]
        spans: dict[str, Span] = {}
        at = 0
        for source_id, span in ordered:
            n = span.stop - span.start
            spans[source_id] = span._replace(start=at, stop=at + n)
            at += n
        self.lexicon.compact(kept, self.size, capacity)
        self.rows = self.rows.gather(kept)
        self.matrix, self.hashes, self.spans, self.size = matrix, hashes, spans, at
        self.graph = None  # its keys were rows of the old array

    def locate(self, passages: Sequence[Candidate]) -> tuple[Matrix, list[int | None]]:
        """The matrix and each passage's row in it (None: its revision is not the one
        held), for `dense_scores` (the caller holds the store's cache lock)."""
        return self.matrix, self._find(passages)

    def _find(self, passages: Sequence[Candidate]) -> list[int | None]:
        spans: list[tuple[int, int] | None] = []
        for p in passages:
            span = self.spans.get(p.source_id)
            current = span is not None and span.revision == p.revision
            spans.append((span.start, span.stop) if current and span is not None else None)
        ids = [p.chunk_id for p in passages]
        return find_rows(self.hashes, spans, ids, chunk_hash, self.rows.chunk_ids)

    def undecided(
        self, allowed: Mapping[str, str], filters: MetadataFilter, decided: Verdicts
    ) -> list[Revision]:
        """The allowed revisions whose verdict under `filters` is not in `decided` (under the
        cache lock; the caller reaches them without it, `decide`, and asks again). When none
        is left, the matching spans are kept for this grant and filter object, and the
        search's captures under this same hold read them (`_hits`)."""
        if self._remembered(allowed, filters) is not None:
            return []
        hits = self._allowed(allowed)
        pending = [s.source for s in hits if id(s.source) not in decided]
        if not pending:
            self._remember(allowed, filters, [s for s in hits if decided[id(s.source)][1]])
        return pending

    def _remembered(self, allowed: Mapping[str, str], filters: MetadataFilter) -> list[Span] | None:
        for entry in self._filtered:
            if entry[0] is allowed and entry[1] is filters:
                return entry[2]
        return None

    def _remember(
        self, allowed: Mapping[str, str], filters: MetadataFilter, hits: list[Span]
    ) -> None:
        self._filtered.insert(0, (allowed, filters, hits))
        del self._filtered[FILTERED:]

    def _hits(self, allowed: Mapping[str, str], filters: MetadataFilter | None) -> list[Span]:
        """The spans of the allowed revisions that match the filters."""
        if filters is None:
            return self._allowed(allowed)
        hits = self._remembered(allowed, filters)
        if hits is None:
            hits = [s for s in self._allowed(allowed) if matches(filters, s.source.metadata)]
            self._remember(allowed, filters, hits)
        return hits

    def _allowed(self, allowed: Mapping[str, str]) -> list[Span]:
        """The spans of the allowed revisions."""
        index = self.spans
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
        return hits

    def capture(self, allowed: Mapping[str, str], filters: MetadataFilter | None) -> Scan | None:
        """The rows of the allowed revisions that match the filters (the caller holds the
        store's cache lock; the scan is then scored without it)."""
        # The same grant again (an application asks for one subject many times): its
        # capture is kept until the segment changes. Not for filtered searches, nor for a
        # grant much larger than the namespace (comparing it would cost more than the walk).
        key = None
        grant = allowed if isinstance(allowed, dict) else None
        if filters is None and grant is not None and len(grant) <= 2 * len(self.spans) + 64:
            key, scan = self.captured(grant)
            if scan is not None:
                return scan
        spans = [(s.start, s.stop) for s in self._hits(allowed, filters) if s.stop > s.start]
        if not spans:
            return None
        scan = Scan.of(self.matrix, self.rows, spans)
        if key is not None and grant is not None:
            self.remember(key, grant, scan)
        return scan

    def lexical_capture(
        self, allowed: Mapping[str, str], terms: Sequence[str], filters: MetadataFilter | None
    ) -> LexicalCapture | None:
        """What a lexical search of these terms over the allowed revisions needs (under the
        store's cache lock; scored afterwards without it)."""
        granted = self._granted(allowed, filters)
        if granted is None:
            return None
        return self.lexicon.capture(terms, granted, self.size, self.rows)

    def lexical_passages(
        self,
        allowed: Mapping[str, str],
        filters: MetadataFilter | None,
        passages: Sequence[Candidate],
        terms: Sequence[str],
    ) -> tuple[LexicalCapture | None, list[int | None]]:
        """The capture `lexical_capture` takes for this grant and these filters (the same
        rows, so the same statistics), and each passage's row (None: not held at its
        revision, or not among the rows that search may rank), for `lexical_scores` (under
        the cache lock)."""
        found = self._find(passages)
        granted = None if not any(s is not None for s in found) else self._granted(allowed, filters)
        if granted is None:
            return None, [None] * len(found)
        mask = granted.mask
        rankable = [s if s is not None and mask[s] else None for s in found]
        return self.lexicon.capture(terms, granted, self.size, self.rows), rankable

    def _granted(
        self, allowed: Mapping[str, str], filters: MetadataFilter | None
    ) -> Granted | None:
        """The rows a lexical search may rank, with their statistics; None when there are
        none. An unfiltered grant's are kept until the segment changes."""
        if self.lexicon.passages == 0 or not allowed:
            return None
        grant = allowed if isinstance(allowed, dict) and filters is None else None
        granted = None if grant is None else self.lexicon.remembered(grant)
        if granted is None:
            hits = self._hits(allowed, filters)
            if not hits:
                return None
            granted = self.lexicon.granted(_mask(hits, self.size))
            if grant is not None:
                self.lexicon.remember(grant, granted)
        return granted if granted.passages else None


def decide(
    pending: Sequence[Revision], filters: MetadataFilter, decided: Verdicts, cancel: CancelToken
) -> None:
    """Each pending revision's verdict under `filters`, into `decided` (no lock held: a filter
    of 256 conditions costs ~0.4 ms per source, seconds over a grant of 10,000, and every
    search and write of the store would wait on the cache lock meanwhile)."""
    for i, source in enumerate(pending):
        if i % DECIDE_BATCH == 0:
            cancel.check()
        decided[id(source)] = (source, matches(filters, source.metadata))


def _rows_below(span: Span, row: int) -> int:
    """How many of the span's rows lie below `row`."""
    return max(0, min(span.stop, row) - span.start)


def _mask(hits: Sequence[Span], size: int) -> npt.NDArray[np.bool_]:
    """The rows of these spans as a mask (spans never overlap: +1 at each start, -1 at each
    stop, and a running sum)."""
    edges = np.zeros(size + 1, dtype=np.int32)
    edges[np.fromiter((s.start for s in hits), np.int64, len(hits))] += 1
    np.subtract.at(edges, np.fromiter((s.stop for s in hits), np.int64, len(hits)), 1)
    mask: npt.NDArray[np.bool_] = np.cumsum(edges[:-1]) > 0
    return mask


@dataclass
class CorpusState:
    descriptor: CorpusDescriptor
    segments: dict[str, Segment]
    generations: dict[tuple[str, str], int]  # (namespace, source_id) -> generation loaded
    loaded_generation: int
    unsnapshotted: int = 0  # rows put or sources removed since the last snapshot (or open)

    @property
    def dimensions(self) -> int:
        return self.descriptor.embedding.dimensions

    def apply(self, loaded: list[Loaded], removed: list[tuple[str, str]]) -> None:
        """Drop removed sources, put loaded revisions (the caller holds the cache lock); the
        lexical index changes in the same step as the vectors."""
        gone: dict[str, list[str]] = {}
        put: dict[str, list[Loaded]] = {}
        for namespace, source_id in removed:
            gone.setdefault(namespace, []).append(source_id)
            self.generations.pop((namespace, source_id), None)
        for item in loaded:
            put.setdefault(item.namespace, []).append(item)
        for namespace in {*gone, *put}:
            segment = self.segments.get(namespace)
            if segment is None:
                if namespace not in put:
                    continue
                segment = self.segments[namespace] = Segment(self.dimensions)
            segment.apply(gone.get(namespace, []), put.get(namespace, []))
        for item in loaded:
            self.generations[(item.namespace, item.source.source_id)] = item.source.generation

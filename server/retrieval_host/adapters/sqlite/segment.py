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
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import numpy as np

from retrieval_host.adapters.sqlite.lexicon import Lexicon
from retrieval_host.adapters.sqlite.scan import Hashes, Matrix, Scan, find_rows
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.filters import MetadataFilter, matches
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate

# Captures (a grant's rows) kept per namespace: at most this many grants, this many sources.
CAPTURES: Final = 64
CAPTURED_SOURCES: Final = 200_000


@dataclass(frozen=True, slots=True)
class Revision:
    """One source revision as the in-memory index knows it (immutable: shared with searches)."""

    source_id: str
    revision: str
    document_sha256: str
    metadata: Mapping[str, Any]
    generation: int


@dataclass(frozen=True, slots=True)
class Row:
    chunk_id: str
    # UTF-8, decoded only for the k results: a str of non-ASCII text takes 2 or 4 bytes per
    # character in memory, which would double the cache of a corpus with accented text.
    text: bytes
    location: Location
    source: Revision


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


class Segment:
    """One corpus namespace: an append-only matrix with contiguous rows per source revision.

    Replacing a source appends its rows and drops the old span; the dead rows are only skipped
    (never scored: searches gather live spans) until the matrix is full, when the live rows are
    compacted into a new array. Rows are never written twice in one array, so a search that
    captured an array and a span list keeps reading consistent data without a lock.
    """

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.matrix: Matrix = np.empty((0, dimensions), dtype=np.float32)
        # Each row's chunk id hashed (`hash`, stable within the process): finds a passage's
        # row among its source's rows without a Python loop (`locate`).
        self.hashes: Hashes = np.empty(0, dtype=np.int64)
        self.rows: list[Row] = []
        self.spans: dict[str, Span] = {}
        self.size = 0
        self.live = 0
        # Grants searched recently, by their size and first and last source, with a copy of
        # the grant and its capture; emptied by any change to the segment.
        self.captures: OrderedDict[GrantKey, tuple[dict[str, str], Scan]] = OrderedDict()
        self._captured_sources = 0

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

    def put(self, loaded: Loaded) -> None:
        self.remove(loaded.source.source_id)
        self._changed()
        count = len(loaded.rows)
        self.reserve(count)
        start = self.size
        self.matrix[start : start + count] = loaded.unit_vectors
        self.hashes[start : start + count] = [hash(cid) for cid, _, _ in loaded.rows]
        self.rows.extend(Row(cid, text, loc, loaded.source) for cid, text, loc in loaded.rows)
        self.spans[loaded.source.source_id] = Span(
            loaded.source.revision, start, start + count, loaded.source
        )
        self.size += count
        self.live += count

    def _compact(self, extra: int) -> None:
        self._changed()
        capacity = max(2 * (self.live + extra), 256)
        matrix = np.empty((capacity, self.dimensions), dtype=np.float32)
        hashes: Hashes = np.empty(capacity, dtype=np.int64)
        rows: list[Row] = []
        spans: dict[str, Span] = {}
        at = 0
        for source_id, span in self.spans.items():
            n = span.stop - span.start
            matrix[at : at + n] = self.matrix[span.start : span.stop]
            hashes[at : at + n] = self.hashes[span.start : span.stop]
            rows.extend(self.rows[span.start : span.stop])
            spans[source_id] = span._replace(start=at, stop=at + n)
            at += n
        self.matrix, self.rows, self.spans, self.size = matrix, rows, spans, at
        self.hashes = hashes

    def locate(self, passages: Sequence[Candidate]) -> tuple[Matrix, list[int | None]]:
        """The matrix and each passage's row in it (None: its revision is not the one
        held), for `dense_scores` (the caller holds the store's cache lock)."""
        spans: list[tuple[int, int] | None] = []
        for p in passages:
            span = self.spans.get(p.source_id)
            current = span is not None and span.revision == p.revision
            spans.append((span.start, span.stop) if current and span is not None else None)
        ids = [p.chunk_id for p in passages]
        found = find_rows(self.hashes, spans, ids, self._chunk_id)
        return self.matrix, found

    def _chunk_id(self, row: int) -> str:
        return self.rows[row].chunk_id

    def capture(self, allowed: Mapping[str, str], filters: MetadataFilter | None) -> Scan | None:
        """The rows of the allowed revisions that match the filters (the caller holds the
        store's cache lock; the scan is then scored without it)."""
        # The same grant again (an application asks for one subject many times): its
        # capture is kept until the segment changes. Not for filtered searches, nor for a
        # grant much larger than the namespace (comparing it would cost more than the walk).
        index = self.spans
        key = None
        grant = allowed if isinstance(allowed, dict) else None
        if filters is None and grant is not None and len(grant) <= 2 * len(index) + 64:
            key, scan = self.captured(grant)
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
        if filters is not None:
            hits = [s for s in hits if matches(filters, s.source.metadata)]
        spans = [(s.start, s.stop) for s in hits if s.stop > s.start]
        if not spans:
            return None
        scan = Scan.of(self.matrix, self.rows, spans)
        if key is not None and grant is not None:
            self.remember(key, grant, scan)
        return scan


@dataclass
class CorpusState:
    descriptor: CorpusDescriptor
    segments: dict[str, Segment]
    generations: dict[tuple[str, str], int]  # (namespace, source_id) -> generation loaded
    loaded_generation: int
    lexicons: dict[str, Lexicon] = field(default_factory=dict)  # per namespace

    @property
    def dimensions(self) -> int:
        return self.descriptor.embedding.dimensions

    def apply(self, loaded: list[Loaded], removed: list[tuple[str, str]]) -> None:
        """Drop removed sources, put loaded revisions (the caller holds the cache lock)."""
        for namespace, source_id in removed:
            segment = self.segments.get(namespace)
            if segment is not None:
                segment.remove(source_id)
            self.generations.pop((namespace, source_id), None)
        incoming: dict[str, int] = {}
        for item in loaded:
            incoming[item.namespace] = incoming.get(item.namespace, 0) + len(item.rows)
        for namespace, count in incoming.items():
            segment = self.segments.get(namespace)
            if segment is None:
                segment = self.segments[namespace] = Segment(self.dimensions)
            segment.reserve(count)
        for item in loaded:
            self.segments[item.namespace].put(item)
            self.generations[(item.namespace, item.source.source_id)] = item.source.generation
        # The lexical index changes in the same step (under the same lock) as the vectors.
        lexical: dict[str, tuple[list[str], list[Loaded]]] = {}
        for namespace, source_id in removed:
            lexical.setdefault(namespace, ([], []))[0].append(source_id)
        for item in loaded:
            lexical.setdefault(item.namespace, ([], []))[1].append(item)
        for namespace, (gone, put) in lexical.items():
            lexicon = self.lexicons.get(namespace)
            if lexicon is None:
                lexicon = self.lexicons[namespace] = Lexicon()
            lexicon.apply(gone, put)

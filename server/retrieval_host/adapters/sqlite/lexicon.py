"""The lexical index of the SQLite store: one in-memory inverted index per corpus namespace.

Why in memory and not FTS5 (bundled with apsw). FTS5's `bm25()` takes N, df and the average
length over the whole FTS table, so per-namespace statistics would need one FTS table per
namespace (created on the fly, by name), and a grant can only be applied by joining it into
the MATCH query. Measured on SciFact (5,183 abstracts, one passage each, the first 300
queries, top 100, this machine with 2 shared cores, the same analyzed text in both):

    FTS5 MATCH (terms OR-ed) ORDER BY bm25, whole table          15.8 ms per query
    FTS5, 10 % grant as `rowid IN (SELECT value FROM json_each)`  1,181 ms per query
    this index, whole namespace granted                          2.4 ms per query
    this index, 10 % grant                                       1.4 ms per query

(Before the grant masks were kept, walking a 5,183-source grant took this index to 33 ms.)
Writing costs about 1.3 ms more per 200-word passage than before the lexical index (analysis
and the posting appends; 2.9 against 1.6 ms per `replace_source`), small beside embedding.
The passages' term frequencies are stored with the vectors (`chunks.terms`, written in the
same transaction), so the index is rebuilt at open without analyzing the text again.

Layout. Each passage of a namespace takes a *slot* (revisions append their passages as
consecutive slots, like the vector segment's rows). Per term, append-only posting arrays of
slots and term frequencies; per slot, the passage length and whether it is live. A search
captures, under the store's cache lock, views of the postings of its query terms, the live
mask and the slot spans of the allowed revisions, then scores them without the lock: postings
are only appended beyond what a capture saw, and the live mask is copied before each change
(copy on write), so a captured view never changes under a search.

Dead slots (replaced or deleted revisions) stay in the postings until they outnumber the live
ones; then the namespace is compacted into new arrays. The allowed-slot mask of an unfiltered
grant is kept (`GRANT_MASKS` per namespace) until the namespace changes, as the vector
segment keeps its captures.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.scan import Hashes, find_rows
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.filters import MetadataFilter, matches
from retrieval_host.core.lexical import Bm25
from retrieval_host.core.models import Location

if TYPE_CHECKING:
    from retrieval_host.adapters.sqlite.segment import Loaded, Revision
    from retrieval_host.core.ports import Candidate

Slots = npt.NDArray[np.int64]
Counts = npt.NDArray[np.int32]
Mask = npt.NDArray[np.bool_]

COMPACT_MIN_SLOTS: Final = 4096
# Allowed-slot masks of recent unfiltered grants kept per namespace (an application searches
# for one subject many times; walking a grant of thousands of sources costs milliseconds).
GRANT_MASKS: Final = 16


class Postings:
    """One term's passages in a namespace: slots and term frequencies, append-only."""

    __slots__ = ("count", "slots", "tfs")

    def __init__(self) -> None:
        self.slots: Slots = np.empty(4, dtype=np.int64)
        self.tfs: Counts = np.empty(4, dtype=np.int32)
        self.count = 0

    def extend(self, slots: Sequence[int], tfs: Sequence[int]) -> None:
        n = len(slots)
        if self.count + n > len(self.slots):
            # New arrays: a search holding views of the old ones keeps reading them intact.
            capacity = max(2 * (self.count + n), 4)
            grown_slots = np.empty(capacity, dtype=np.int64)
            grown_tfs = np.empty(capacity, dtype=np.int32)
            grown_slots[: self.count] = self.slots[: self.count]
            grown_tfs[: self.count] = self.tfs[: self.count]
            self.slots, self.tfs = grown_slots, grown_tfs
        self.slots[self.count : self.count + n] = slots
        self.tfs[self.count : self.count + n] = tfs
        self.count += n

    def view(self) -> tuple[Slots, Counts]:
        return self.slots[: self.count], self.tfs[: self.count]


PassageRow = tuple[str, bytes, Location]  # chunk id, UTF-8 text, location


@dataclass(frozen=True, slots=True)
class SourceSlots:
    source: Revision
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class LexicalCapture:
    """What a lexical search took under the cache lock; scored afterwards without it."""

    postings: dict[str, tuple[Slots, Counts]]
    live: npt.NDArray[np.bool_]
    lengths: Counts
    size: int
    passages: int
    total_length: int
    allowed: npt.NDArray[np.bool_]  # the slots the search may rank
    rows: list[PassageRow]
    sources: list[Revision]


class Lexicon:
    """One corpus namespace's inverted index (the caller holds the store's cache lock)."""

    def __init__(self) -> None:
        self.postings: dict[str, Postings] = {}
        self.spans: dict[str, SourceSlots] = {}
        self.rows: list[PassageRow] = []
        self.row_sources: list[Revision] = []
        self.lengths: Counts = np.empty(0, dtype=np.int32)
        self.hashes: Hashes = np.empty(0, dtype=np.int64)  # each slot's chunk id, hashed
        self.live: npt.NDArray[np.bool_] = np.empty(0, dtype=np.bool_)
        self.size = 0
        self.passages = 0
        self.total_length = 0
        self.masks: OrderedDict[tuple[int, str, str], tuple[dict[str, str], Mask]] = OrderedDict()

    def apply(self, removed: Sequence[str], loaded: Sequence[Loaded]) -> None:
        """Drop `removed` sources and put `loaded` revisions (replacing their sources)."""
        self.masks.clear()
        needed = self.size + sum(len(item.rows) for item in loaded)
        if needed > len(self.lengths):
            # New slots are written beyond what any capture saw; growing makes a new array.
            lengths = np.zeros(max(2 * needed, 64), dtype=np.int32)
            lengths[: self.size] = self.lengths[: self.size]
            self.lengths = lengths
            hashes: Hashes = np.zeros(len(lengths), dtype=np.int64)
            hashes[: self.size] = self.hashes[: self.size]
            self.hashes = hashes
        # Copy on write: a search may hold the current live mask.
        live = np.zeros(len(self.lengths), dtype=np.bool_)
        live[: self.size] = self.live[: self.size]
        self.live = live
        for source_id in removed:
            self._drop(source_id)
        for item in loaded:
            self._drop(item.source.source_id)
        batch: dict[str, tuple[list[int], list[int]]] = {}
        for item in loaded:
            start = self.size
            for (chunk_id, text, location), terms in zip(item.rows, item.terms, strict=True):
                slot = self.size
                self.size += 1
                self.rows.append((chunk_id, text, location))
                self.row_sources.append(item.source)
                length = sum(terms.values())
                self.lengths[slot] = length
                self.hashes[slot] = hash(chunk_id)
                self.live[slot] = True
                self.total_length += length
                self.passages += 1
                for term, tf in terms.items():
                    entry = batch.get(term)
                    if entry is None:
                        entry = batch[term] = ([], [])
                    entry[0].append(slot)
                    entry[1].append(tf)
            self.spans[item.source.source_id] = SourceSlots(item.source, start, self.size)
        for term, (slots, tfs) in batch.items():
            postings = self.postings.get(term)
            if postings is None:
                postings = self.postings[term] = Postings()
            postings.extend(slots, tfs)
        if self.size >= COMPACT_MIN_SLOTS and self.passages < self.size // 2:
            self._compact()

    def _drop(self, source_id: str) -> None:
        span = self.spans.pop(source_id, None)
        if span is None:
            return
        self.live[span.start : span.stop] = False
        self.passages -= span.stop - span.start
        self.total_length -= int(self.lengths[span.start : span.stop].sum())

    def _compact(self) -> None:
        live = self.live[: self.size]
        remap = np.cumsum(live, dtype=np.int64) - 1
        postings: dict[str, Postings] = {}
        for term, old in self.postings.items():
            slots, tfs = old.view()
            keep = live[slots]
            if not keep.any():
                continue
            fresh = postings[term] = Postings()
            fresh.slots, fresh.tfs = remap[slots[keep]], tfs[keep].copy()
            fresh.count = len(fresh.slots)
        kept = np.flatnonzero(live)
        self.postings = postings
        self.rows = [self.rows[i] for i in kept.tolist()]
        self.row_sources = [self.row_sources[i] for i in kept.tolist()]
        count = len(kept)
        self.lengths = np.concatenate([self.lengths[kept], np.zeros(count, dtype=np.int32)])
        self.hashes = np.concatenate([self.hashes[kept], np.zeros(count, dtype=np.int64)])
        self.live = np.zeros(len(self.lengths), dtype=np.bool_)
        self.live[:count] = True
        self.spans = {
            sid: SourceSlots(s.source, int(remap[s.start]), int(remap[s.start]) + s.stop - s.start)
            for sid, s in self.spans.items()
        }
        self.size = count

    def capture(
        self,
        allowed: Mapping[str, str],
        terms: Sequence[str],
        filters: MetadataFilter | None,
    ) -> LexicalCapture | None:
        """What a search of these terms over the allowed revisions needs (the caller holds the
        store's cache lock; the capture is then scored without it)."""
        if self.passages == 0:
            return None
        mask = self._allowed(allowed, filters)
        return None if mask is None else self._capture(terms, mask)

    def capture_passages(
        self, passages: Sequence[Candidate], terms: Sequence[str]
    ) -> tuple[LexicalCapture | None, list[int | None]]:
        """A capture that may rank only `passages` (those whose revision is the one held), and
        each passage's slot (None: not held), for `lexical_scores` (under the cache lock)."""
        spans: list[tuple[int, int] | None] = []
        for p in passages:
            span = self.spans.get(p.source_id)
            current = span is not None and span.source.revision == p.revision
            spans.append((span.start, span.stop) if current and span is not None else None)
        ids = [p.chunk_id for p in passages]
        slots = find_rows(self.hashes, spans, ids, self._chunk_id)
        held = [s for s in slots if s is not None]
        if self.passages == 0 or not held:
            return None, slots
        mask: Mask = np.zeros(self.size, dtype=np.bool_)
        mask[held] = True
        return self._capture(terms, mask), slots

    def _capture(self, terms: Sequence[str], allowed: Mask) -> LexicalCapture:
        """The postings of `terms` and the namespace's arrays as they are now, ranking only
        the `allowed` slots."""
        postings = {term: found.view() for term in set(terms) if (found := self.postings.get(term))}
        return LexicalCapture(
            postings,
            self.live,
            self.lengths,
            self.size,
            self.passages,
            self.total_length,
            allowed,
            self.rows,
            self.row_sources,
        )

    def _chunk_id(self, slot: int) -> str:
        return self.rows[slot][0]

    def _allowed(self, allowed: Mapping[str, str], filters: MetadataFilter | None) -> Mask | None:
        key = None
        grant = allowed if isinstance(allowed, dict) and allowed and filters is None else None
        if grant is not None:
            key = (len(grant), next(iter(grant)), next(reversed(grant)))
            entry = self.masks.get(key)
            # A dict comparison (C, no allocation) costs far less than walking the grant.
            if entry is not None and entry[0] == grant:
                self.masks.move_to_end(key)
                return entry[1]
        # Walk the smaller side: the grant or the namespace's sources.
        if len(allowed) <= len(self.spans):
            get = self.spans.get
            hits = [
                span
                for sid, revision in allowed.items()
                if (span := get(sid)) is not None and span.source.revision == revision
            ]
        else:
            granted = allowed.get
            hits = [s for sid, s in self.spans.items() if granted(sid) == s.source.revision]
        if filters is not None:
            hits = [s for s in hits if matches(filters, s.source.metadata)]
        if not hits:
            return None
        # Spans never overlap: +1 at each start, -1 at each stop, and a running sum.
        edges = np.zeros(self.size + 1, dtype=np.int32)
        edges[np.fromiter((s.start for s in hits), np.int64, len(hits))] += 1
        np.subtract.at(edges, np.fromiter((s.stop for s in hits), np.int64, len(hits)), 1)
        mask: Mask = np.cumsum(edges[:-1]) > 0
        if key is not None and grant is not None:
            self.masks[key] = (dict(grant), mask)
            while len(self.masks) > GRANT_MASKS:
                self.masks.popitem(last=False)
        return mask


def _weighted_postings(
    capture: LexicalCapture, terms: Sequence[str], cancel: CancelToken
) -> Iterator[tuple[Slots, Counts, float]]:
    """Per query term held by the namespace: its postings and its weight (occurrences in the
    query x idf). Terms in code point order, the order the PostgreSQL store sums them in:
    floating-point addition is not associative, and equal passages must score equal in both
    stores (and in `score` and `score_slots`)."""
    for term, count in sorted(Counter(terms).items()):
        cancel.check()
        found = capture.postings.get(term)
        if found is None:
            continue
        slots, tfs = found
        df = int(np.count_nonzero(capture.live[slots]))
        if df == 0:
            continue
        yield slots, tfs, count * Bm25.idf(df, capture.passages)


def score(
    capture: LexicalCapture, terms: Sequence[str], bm25: Bm25, k: int, cancel: CancelToken
) -> list[tuple[int, float]]:
    """The top k (slot, BM25 score) of a capture, best first, equal scores by chunk id."""
    allowed = capture.allowed
    scores = np.zeros(capture.size, dtype=np.float64)
    average = capture.total_length / capture.passages
    for slots, tfs, weight in _weighted_postings(capture, terms, cancel):
        mine = allowed[slots]
        hit = slots[mine]
        tf = tfs[mine].astype(np.float64)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * capture.lengths[hit] / average)
        # A slot appears once per term: the fancy-indexed add touches each hit once.
        scores[hit] += weight * (tf / (tf + norm))
        cancel.progress()
    matched = np.flatnonzero(scores > 0)
    if len(matched) > k:
        kth = np.partition(scores[matched], len(matched) - k)[len(matched) - k]
        matched = matched[scores[matched] >= kth]
    ranked = sorted(
        ((int(slot), float(scores[slot])) for slot in matched),
        key=lambda item: (-item[1], capture.rows[item[0]][0]),
    )
    return ranked[:k]


def score_slots(
    capture: LexicalCapture, slots: Slots, terms: Sequence[str], bm25: Bm25, cancel: CancelToken
) -> npt.NDArray[np.float64]:
    """The BM25 score of each of `slots` (0 where no term matches): the same operations in
    the same order as `score`, so equal to what a search gives them, but each term's
    postings (ascending slots) are searched for the wanted slots rather than all scored."""
    scores = np.zeros(len(slots), dtype=np.float64)
    if not len(slots):
        return scores
    average = capture.total_length / capture.passages
    lengths = capture.lengths[slots]
    for posted, tfs, weight in _weighted_postings(capture, terms, cancel):
        at = np.minimum(np.searchsorted(posted, slots), len(posted) - 1)
        hit = posted[at] == slots
        tf = tfs[at[hit]].astype(np.float64)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * lengths[hit] / average)
        scores[hit] += weight * (tf / (tf + norm))
    return scores
    average = capture.total_length / capture.passages
    lengths = capture.lengths[slots]
    for term, count in sorted(Counter(terms).items()):
        cancel.check()
        found = capture.postings.get(term)
        if found is None:
            continue
        posted, tfs = found
        df = int(np.count_nonzero(capture.live[posted]))
        if df == 0:
            continue
        idf = Bm25.idf(df, capture.passages)
        at = np.minimum(np.searchsorted(posted, slots), len(posted) - 1)
        hit = posted[at] == slots
        tf = tfs[at[hit]].astype(np.float64)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * lengths[hit] / average)
        scores[hit] += count * idf * (tf / (tf + norm))
    return scores

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

Layout. A passage's *slot* is its row in the namespace's vector segment (`segment.Segment`,
which owns the lexicon and changes both in one step). Per term, append-only posting arrays of
slots and term frequencies; per slot, the passage length and whether it is live. A search
captures, under the store's cache lock, views of the postings of its query terms and the mask
of the rows it may rank (live, allowed, matching the filters) with that set's BM25 statistics
(`Granted`), then scores them without the lock: postings are only appended beyond what a
capture saw, and the live mask is copied before each change (copy on write), so a captured
view never changes under a search.

Statistics. N, the total length and each query term's df are counted over the rows the search
may rank, never over the whole namespace: a passage's score must not depend on passages its
caller may not read (else adding or deleting an unreadable source that holds the query's words
moves the readable passages' scores, an oracle for what the unreadable ones contain). df is
counted from the term's postings under the mask; N and the total length cost one pass over the
mask (100k rows: about 0.1 ms), so they are kept with the mask of an unfiltered grant.

Dead slots (replaced or deleted revisions) stay in the postings until the segment compacts
its rows; the postings are then renumbered into new arrays. The allowed-row mask of an
unfiltered grant and its statistics are kept (`GRANT_MASKS` per namespace) until the
namespace changes, as the segment keeps its captures.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.rows import Blob, Rows
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.lexical import Bm25

Slots = npt.NDArray[np.int64]
Counts = npt.NDArray[np.int32]
Mask = npt.NDArray[np.bool_]

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


# Bytes of each term kept in the fixed-width sorted key array of `BasePostings`.
KEY_BYTES: Final = 16


class BasePostings:
    """Every term's postings as one read-only block (compressed sparse rows), as a snapshot
    maps them from its file (`snapshot`): terms sorted by their UTF-8 bytes, found by a binary
    search over fixed-width prefixes, so no per-term Python object is built at open."""

    __slots__ = ("keys", "offsets", "slots", "terms", "tfs")

    def __init__(
        self,
        terms: Blob,
        keys: npt.NDArray[np.bytes_],
        offsets: Slots,
        slots: Slots,
        tfs: Counts,
    ) -> None:
        self.terms, self.keys, self.offsets, self.slots, self.tfs = terms, keys, offsets, slots, tfs

    @classmethod
    def build(cls, postings: Mapping[str, tuple[Slots, Counts]]) -> BasePostings:
        """The block of these postings (a snapshot's writer)."""
        encoded = sorted((term.encode("utf-8"), term) for term in postings)
        terms = Blob()
        terms.extend([raw for raw, _ in encoded])
        keys = np.array([raw[:KEY_BYTES] for raw, _ in encoded], dtype=f"S{KEY_BYTES}")
        parts = [postings[term] for _, term in encoded]
        counts = np.fromiter((len(slots) for slots, _ in parts), np.int64, len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        slots = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
        tfs = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int32)
        return cls(terms, keys, offsets, slots.astype(np.int64), tfs.astype(np.int32))

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, term: str) -> tuple[Slots, Counts] | None:
        raw = term.encode("utf-8")
        key = raw[:KEY_BYTES]
        at = int(np.searchsorted(self.keys, key))
        while at < len(self.keys) and self.keys[at] == key:
            if len(raw) <= KEY_BYTES or self.terms.get(at) == raw:
                low, high = int(self.offsets[at]), int(self.offsets[at + 1])
                return self.slots[low:high], self.tfs[low:high]
            at += 1
        return None

    def items(self) -> Iterator[tuple[str, tuple[Slots, Counts]]]:
        data, ends = self.terms.arrays()
        raw = data.tobytes()
        start = 0
        for i, end in enumerate(ends.tolist()):
            low, high = int(self.offsets[i]), int(self.offsets[i + 1])
            yield raw[start:end].decode("utf-8"), (self.slots[low:high], self.tfs[low:high])
            start = end


@dataclass(frozen=True, slots=True)
class Granted:
    """The rows one search may rank (live, allowed, matching its filters) and their BM25
    statistics: N and the sum of their lengths (the average length is their quotient)."""

    mask: Mask  # over the segment's first `len(mask)` rows
    passages: int
    total_length: int


@dataclass(frozen=True, slots=True)
class LexicalCapture:
    """What a lexical search took under the cache lock; scored afterwards without it."""

    postings: dict[str, list[tuple[Slots, Counts]]]  # per term: the base's, then appended
    lengths: Counts
    size: int
    granted: Granted  # the rows the search may rank, and the statistics it scores with
    rows: Rows

    @property
    def allowed(self) -> Mask:
        return self.granted.mask


class Lexicon:
    """One corpus namespace's inverted index, over its segment's rows (the segment calls it
    under the store's cache lock)."""

    def __init__(self, base: BasePostings | None = None) -> None:
        self.base = base  # a snapshot's postings, read-only; then `postings`, appended since
        self.postings: dict[str, Postings] = {}
        self.lengths: Counts = np.empty(0, dtype=np.int32)
        self.live: Mask = np.empty(0, dtype=np.bool_)
        self.passages = 0
        self.total_length = 0
        self.masks: OrderedDict[tuple[int, str, str], tuple[dict[str, str], Granted]] = (
            OrderedDict()
        )

    def begin(self, capacity: int) -> None:
        """Before a change: a new live mask (a search may hold the current one) of the
        segment's capacity."""
        self.masks.clear()
        live = np.zeros(max(capacity, len(self.live)), dtype=np.bool_)
        live[: len(self.live)] = self.live
        self.live = live

    def drop(self, start: int, stop: int) -> None:
        self.live[start:stop] = False
        self.passages -= stop - start
        self.total_length -= int(self.lengths[start:stop].sum())

    def add(self, start: int, terms: Sequence[Mapping[str, int]]) -> None:
        """The term frequencies of rows `start`, `start + 1`, ... (new rows)."""
        stop = start + len(terms)
        if stop > len(self.lengths):
            self.lengths = _grown(self.lengths, start, max(stop, len(self.live)))
        if stop > len(self.live):
            self.live = _grown(self.live, start, len(self.lengths))
        batch: dict[str, tuple[list[int], list[int]]] = {}
        for slot, row in enumerate(terms, start):
            for term, tf in row.items():
                entry = batch.get(term)
                if entry is None:
                    entry = batch[term] = ([], [])
                entry[0].append(slot)
                entry[1].append(tf)
        lengths = np.fromiter((sum(row.values()) for row in terms), np.int32, len(terms))
        self.lengths[start:stop] = lengths
        self.live[start:stop] = True
        self.total_length += int(lengths.sum())
        self.passages += len(terms)
        for term, (slots, tfs) in batch.items():
            postings = self.postings.get(term)
            if postings is None:
                postings = self.postings[term] = Postings()
            postings.extend(slots, tfs)

    def compact(self, kept: Slots, size: int, capacity: int) -> None:
        """The segment moved rows `kept` (ascending) to 0, 1, ...: renumber the postings."""
        remap = np.full(size, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept), dtype=np.int64)
        postings: dict[str, Postings] = {}
        for term, slots, tfs in self._every_term():
            moved = remap[slots]
            keep = moved >= 0
            if not keep.any():
                continue
            fresh = postings[term] = Postings()
            fresh.slots, fresh.tfs = moved[keep], tfs[keep]
            fresh.count = len(fresh.slots)
        self.base, self.postings = None, postings
        lengths = np.zeros(capacity, dtype=np.int32)
        lengths[: len(kept)] = self.lengths[kept]
        self.lengths = lengths
        self.live = np.zeros(capacity, dtype=np.bool_)
        self.live[: len(kept)] = True

    def _every_term(self) -> Iterator[tuple[str, Slots, Counts]]:
        """Each term's postings, the base's and the appended ones joined (a compaction)."""
        if self.base is not None:
            for term, (slots, tfs) in self.base.items():
                more = self.postings.get(term)
                if more is not None:
                    extra_slots, extra_tfs = more.view()
                    slots = np.concatenate((slots, extra_slots))
                    tfs = np.concatenate((tfs, extra_tfs))
                yield term, slots, tfs
        for term, postings in self.postings.items():
            if self.base is None or self.base.find(term) is None:
                yield term, *postings.view()

    def postings_of(self, term: str) -> list[tuple[Slots, Counts]]:
        """A term's postings as they are now: the base's, then those appended since."""
        parts = []
        if self.base is not None and (found := self.base.find(term)) is not None and len(found[0]):
            parts.append(found)
        appended = self.postings.get(term)
        if appended is not None:
            parts.append(appended.view())
        return parts

    def granted(self, allowed: Mask) -> Granted:
        """The live rows among `allowed` (a mask over the first `len(allowed)` rows) and their
        statistics."""
        size = len(allowed)
        mask: Mask = allowed & self.live[:size]
        passages = int(np.count_nonzero(mask))
        # Compressed, then summed, as the snapshot loader counts: on 100k rows masked by
        # source spans about 0.1 ms here (`sum(where=mask)` was no faster).
        total = int(self.lengths[:size][mask].sum(dtype=np.int64))
        return Granted(mask, passages, total)

    def remembered(self, grant: dict[str, str]) -> Granted | None:
        """The rows and statistics of exactly this unfiltered grant, if kept."""
        key = (len(grant), next(iter(grant)), next(reversed(grant)))
        entry = self.masks.get(key)
        # A dict comparison (C, no allocation) costs far less than walking the grant.
        if entry is None or entry[0] != grant:
            return None
        self.masks.move_to_end(key)
        return entry[1]

    def remember(self, grant: dict[str, str], granted: Granted) -> None:
        key = (len(grant), next(iter(grant)), next(reversed(grant)))
        self.masks[key] = (dict(grant), granted)
        while len(self.masks) > GRANT_MASKS:
            self.masks.popitem(last=False)

    def capture(
        self, terms: Sequence[str], granted: Granted, size: int, rows: Rows
    ) -> LexicalCapture:
        """The postings of `terms` and the namespace's arrays as they are now, ranking (and
        counting statistics over) only the `granted` rows."""
        postings = {term: parts for term in set(terms) if (parts := self.postings_of(term))}
        return LexicalCapture(postings, self.lengths, size, granted, rows)


def _grown(array: npt.NDArray[Any], size: int, capacity: int) -> npt.NDArray[Any]:
    grown = np.zeros(max(capacity, 64), dtype=array.dtype)
    grown[:size] = array[:size]
    return grown


def _weighted_postings(
    capture: LexicalCapture, terms: Sequence[str], cancel: CancelToken
) -> Iterator[tuple[Slots, Counts, float]]:
    """Per query term held by the rows the capture may rank: its postings among those rows
    (ascending slots) and its weight (occurrences in the query x idf, df and N counted over
    those rows only). Terms in code point order, the order the PostgreSQL store sums them in:
    floating-point addition is not associative, and equal passages must score equal in both
    stores (and in `score` and `score_slots`)."""
    allowed = capture.allowed
    for term, count in sorted(Counter(terms).items()):
        cancel.check()
        parts = capture.postings.get(term)
        if parts is None:
            continue
        mine = [(slots[m], tfs[m]) for slots, tfs in parts if (m := allowed[slots]).any()]
        df = sum(len(slots) for slots, _ in mine)
        if df == 0:
            continue
        weight = count * Bm25.idf(df, capture.granted.passages)
        # A row is in one part only: each row still gets its terms' scores in term order.
        for slots, tfs in mine:
            yield slots, tfs, weight


def _average_length(capture: LexicalCapture) -> float:
    granted = capture.granted
    return granted.total_length / granted.passages


def score(
    capture: LexicalCapture, terms: Sequence[str], bm25: Bm25, k: int, cancel: CancelToken
) -> list[tuple[int, float]]:
    """The top k (slot, BM25 score) of a capture, best first, equal scores by chunk id."""
    scores = np.zeros(capture.size, dtype=np.float64)
    average = _average_length(capture)
    for hit, tfs, weight in _weighted_postings(capture, terms, cancel):
        tf = tfs.astype(np.float64)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * capture.lengths[hit] / average)
        # A slot appears once per term: the fancy-indexed add touches each hit once.
        scores[hit] += weight * (tf / (tf + norm))
        cancel.progress()
    matched = np.flatnonzero(scores > 0)
    if len(matched) > k:
        kth = np.partition(scores[matched], len(matched) - k)[len(matched) - k]
        matched = matched[scores[matched] >= kth]
    held: list[int] = matched.tolist()
    values: list[float] = scores[matched].tolist()
    ids = capture.rows.ids.get_many(held)  # ties in chunk id order (UTF-8 sorts as str)
    order = sorted(range(len(held)), key=lambda i: (-values[i], ids[i]))
    return [(held[i], values[i]) for i in order[:k]]


def score_slots(
    capture: LexicalCapture, slots: Slots, terms: Sequence[str], bm25: Bm25, cancel: CancelToken
) -> npt.NDArray[np.float64]:
    """The BM25 score of each of `slots` (0 where no term matches): the same operations in
    the same order as `score`, so equal to what a search gives them, but each term's
    postings (ascending slots) are searched for the wanted slots rather than all scored."""
    scores = np.zeros(len(slots), dtype=np.float64)
    if not len(slots):
        return scores
    average = _average_length(capture)
    lengths = capture.lengths[slots]
    for posted, tfs, weight in _weighted_postings(capture, terms, cancel):
        at = np.minimum(np.searchsorted(posted, slots), len(posted) - 1)
        hit = posted[at] == slots
        tf = tfs[at[hit]].astype(np.float64)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * lengths[hit] / average)
        scores[hit] += weight * (tf / (tf + norm))
    return scores

"""What an index snapshot is written from: a namespace's arrays captured under the store's cache
lock (`image`), and the same with only its live sources' rows (`live_rows`), gathered piece by
piece as they are written (the file format is in `snapshot`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.lexicon import BasePostings
from retrieval_host.adapters.sqlite.segment import Segment

# A namespace's byte blobs, each with its end offsets (`<name>_ends`).
BYTE_ARRAYS: Final = ("ids", "text", "documents")


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One live source of a snapshot: where its rows are and what SQLite must still hold.

    `fingerprint` is the write's content fingerprint (`sources.fingerprint`: passages, their
    locations, provenance), "" when unknown (an entry that matches no SQLite row). Revision,
    digest and commit generation alone did not tell two writes apart: a restored database
    counts generations again from the backup's, so a later write reused a generation the
    snapshot had recorded for other text, and the snapshot's text was served (probe T,
    session 40); a caller-given document digest, or one of the text alone, says nothing of
    the passages or their locations."""

    source_id: str
    revision: str
    document_sha256: str
    generation: int
    start: int
    stop: int
    fingerprint: str = ""

    def key(self) -> tuple[str, str, str, int, int]:
        """What SQLite must hold for this source for its rows to be used: revision, document
        digest, content fingerprint, commit generation and passage count."""
        return (
            self.revision,
            self.document_sha256,
            self.fingerprint,
            self.generation,
            self.stop - self.start,
        )


@dataclass(frozen=True, slots=True)
class NamespaceImage:
    """A namespace's arrays as they were when captured (under the store's cache lock): rows
    below `size` are never rewritten, so the arrays can be written out without the lock."""

    namespace: str
    size: int
    arrays: dict[str, Array]
    sources: list[SourceEntry]
    postings: dict[str, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]]
    base: BasePostings | None


def image(namespace: str, segment: Segment) -> NamespaceImage:
    """Capture a segment for writing (the caller holds the store's cache lock): references to
    its arrays and copies of its small mutable parts, nothing of the size of the data."""
    size = segment.size
    rows = segment.rows
    arrays: dict[str, Array] = {
        "matrix": segment.matrix[:size],
        "hashes": segment.hashes[:size],
        "has_document": rows.has_document[:size],
        "locations": rows.locations[:size],
        "source_of": rows.source_of[:size],
        "lengths": segment.lexicon.lengths[:size],
    }
    for name, blob in (("ids", rows.ids), ("text", rows.text), ("documents", rows.documents)):
        arrays[name], arrays[f"{name}_ends"] = blob.arrays()
    sources = [
        SourceEntry(
            sid, span.revision, span.source.document_sha256, span.source.generation, *span[1:3]
        )
        for sid, span in segment.spans.items()
    ]
    # Postings objects are appended to later (beyond `size`): keep the arrays and counts now.
    postings = {term: [p.view()] for term, p in segment.lexicon.postings.items()}
    return NamespaceImage(namespace, size, arrays, sources, postings, segment.lexicon.base)


def with_fingerprints(
    ns: NamespaceImage, held: Mapping[tuple[str, str], tuple[int, str]]
) -> NamespaceImage:
    """The image with each source's content fingerprint as SQLite holds it (`held`:
    (namespace, source id) -> (commit generation, fingerprint)), read after the capture. A
    source SQLite holds at another generation (written again since) gets none: its rows are
    read from SQLite at the next open."""

    def fingerprint(entry: SourceEntry) -> str:
        row = held.get((ns.namespace, entry.source_id))
        return row[1] if row is not None and row[0] == entry.generation else ""

    return replace(ns, sources=[replace(e, fingerprint=fingerprint(e)) for e in ns.sources])


def postings(ns: NamespaceImage) -> BasePostings:
    """All of a namespace's postings as one block (the base's and the appended joined)."""
    joined: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]] = {}
    if ns.base is not None:
        for term, part in ns.base.items():
            joined[term] = part
    for term, parts in ns.postings.items():
        slots, tfs = parts[0]
        if term in joined:
            first = joined[term]
            slots, tfs = np.concatenate((first[0], slots)), np.concatenate((first[1], tfs))
        joined[term] = (slots, tfs)
    return BasePostings.build(joined)


def source_of(ns: NamespaceImage) -> npt.NDArray[np.int32]:
    """Each row's source as its index in `ns.sources` (-1 for a dead row)."""
    source_of = np.full(ns.size, -1, dtype=np.int32)
    for i, entry in enumerate(ns.sources):
        source_of[entry.start : entry.stop] = i
    return source_of


@dataclass(frozen=True, slots=True)
class _Taken:
    """Rows `kept` of `array`, gathered piece by piece as they are written: the live rows of a
    large matrix are not copied whole. Runs of consecutive rows are written as they lie."""

    array: npt.NDArray[Any]
    kept: npt.NDArray[np.int64]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.kept), *self.array.shape[1:])

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    @property
    def itemsize(self) -> int:
        return int(self.array.itemsize)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    def __len__(self) -> int:
        return len(self.kept)

    def pieces(self) -> Iterator[npt.NDArray[Any]]:
        for i in range(0, len(self.kept), _TAKE_ROWS):
            yield np.ascontiguousarray(self.array[self.kept[i : i + _TAKE_ROWS]])


@dataclass(frozen=True, slots=True)
class _Runs:
    """Byte ranges of `data` written one after another (a blob's live strings)."""

    data: npt.NDArray[np.uint8]
    runs: list[tuple[int, int]]
    nbytes: int

    shape = property(lambda self: (self.nbytes,))
    dtype = property(lambda self: self.data.dtype)
    itemsize = 1

    def __len__(self) -> int:
        return self.nbytes

    def pieces(self) -> Iterator[npt.NDArray[Any]]:
        for low, high in self.runs:
            yield self.data[low:high]


Array = npt.NDArray[Any] | _Taken | _Runs
# Rows of a matrix gathered at a time when a snapshot leaves dead rows out (~6 MB at 384
# dimensions).
_TAKE_ROWS: Final = 4096


def pieces(array: Array) -> Iterator[npt.NDArray[Any]]:
    """An array's bytes as contiguous pieces, in order (a lazy one's gathered as they go)."""
    if isinstance(array, _Taken | _Runs):
        return array.pieces()
    return iter((np.ascontiguousarray(array),))


def _taken_bytes(
    data: npt.NDArray[np.uint8], ends: npt.NDArray[np.int64], kept: npt.NDArray[np.int64]
) -> tuple[_Runs, npt.NDArray[np.int64]]:
    """The strings at `kept` (ascending) as runs of `data`, and their new end offsets."""
    if not len(kept):
        return _Runs(data, [], 0), np.empty(0, np.int64)
    starts = np.concatenate(([0], ends[:-1]))[kept]
    lengths = ends[kept] - starts
    new_ends = np.cumsum(lengths, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(kept) != 1) + 1
    firsts = np.concatenate(([0], breaks)).tolist()
    lasts = (np.concatenate((breaks, [len(kept)])) - 1).tolist()
    begin, end = starts.tolist(), (starts + lengths).tolist()
    runs = [(begin[f], end[la]) for f, la in zip(firsts, lasts, strict=True)]
    return _Runs(data, runs, int(new_ends[-1])), new_ends


def _captured(array: Array) -> npt.NDArray[Any]:
    """An array of `image` (which captures arrays only; `_live_rows` makes the others)."""
    if not isinstance(array, np.ndarray):
        raise TypeError("an image's arrays are numpy arrays")
    return array


def live_rows(ns: NamespaceImage) -> NamespaceImage:
    """The image with only its live sources' rows, renumbered in row order, and the postings
    of those rows only: dead rows' text, vectors and terms are not written to the file."""
    ordered = sorted(ns.sources, key=lambda entry: entry.start)
    live = sum(entry.stop - entry.start for entry in ordered)
    if live == ns.size:
        return ns
    kept = (
        np.concatenate([np.arange(e.start, e.stop, dtype=np.int64) for e in ordered])
        if ordered
        else np.empty(0, np.int64)
    )
    captured = {name: _captured(array) for name, array in ns.arrays.items()}
    arrays: dict[str, Array] = {
        name: captured[name][kept] for name in ("hashes", "has_document", "locations", "lengths")
    }
    arrays["matrix"] = _Taken(captured["matrix"], kept)
    for name in BYTE_ARRAYS:
        arrays[name], arrays[f"{name}_ends"] = _taken_bytes(
            captured[name], captured[f"{name}_ends"], kept
        )
    sources: list[SourceEntry] = []
    at = 0
    for entry in ordered:
        n = entry.stop - entry.start
        sources.append(replace(entry, start=at, stop=at + n))
        at += n
    remap = np.full(ns.size, -1, dtype=np.int64)
    remap[kept] = np.arange(len(kept), dtype=np.int64)
    kept_postings: dict[str, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]] = {}
    for term, (slots, tfs) in postings(ns).items():
        moved = remap[slots]
        keep = moved >= 0
        if keep.any():
            kept_postings[term] = [(moved[keep], tfs[keep])]
    return NamespaceImage(ns.namespace, live, arrays, sources, kept_postings, None)

"""The passages of an in-memory corpus namespace, column by column.

One Python object per passage (its chunk id, text, location and source) cost about 300 bytes
besides the text, took most of the time of loading a large corpus, and could not be shared
between worker processes. `Rows` keeps them in a few flat arrays instead (UTF-8 bytes with end
offsets, integers), which a snapshot writes as they are and a later open maps from the file
(`snapshot`), and builds a passage's `Row` only when a search returns it.

Rows are appended beyond `size` and never rewritten, and a growing column is copied into a new
array: a search that captured a `Rows` keeps reading consistent rows without a lock (a
compaction builds a new `Rows`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.core.models import Location

Bytes = npt.NDArray[np.uint8]
Ends = npt.NDArray[np.int64]
Ints = npt.NDArray[np.int32]

# A location field that is None.
NONE: Final = -1


@dataclass(frozen=True, slots=True)
class Revision:
    """One source revision as the in-memory index knows it (immutable: shared with searches)."""

    source_id: str
    revision: str
    document_sha256: str
    metadata: Mapping[str, Any]
    generation: int
    # `sources.media_type` (None for prepared passages): decides what a hit shows of the
    # metadata (`core.passage_metadata`). Read from SQLite, never from a snapshot file.
    media_type: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """One passage, built from the columns when a search returns it."""

    chunk_id: str
    text: bytes  # UTF-8: decoded only for the results
    location: Location
    source: Revision


def chunk_hash(chunk_id: str) -> int:
    """A chunk id's hash, the same in every process (a snapshot stores them): finds a passage's
    row without a Python loop; every match is checked against the chunk id itself."""
    return zlib.crc32(chunk_id.encode("utf-8"))


class Blob:
    """Variable-length byte strings, appended: one byte array and each string's end offset."""

    __slots__ = ("data", "ends", "size", "used")

    def __init__(
        self, data: Bytes | None = None, ends: Ends | None = None, size: int | None = None
    ) -> None:
        """Empty, or the first `size` strings (all of `ends` by default) of these arrays; the
        arrays may be longer (room to append in place)."""
        self.data: Bytes = np.empty(0, np.uint8) if data is None else data
        self.ends: Ends = np.empty(0, np.int64) if ends is None else ends
        self.size = len(self.ends) if size is None else size
        self.used = int(self.ends[self.size - 1]) if self.size else 0

    def get(self, i: int) -> bytes:
        start = int(self.ends[i - 1]) if i else 0
        return self.data[start : int(self.ends[i])].tobytes()

    def get_many(self, rows: Sequence[int]) -> list[bytes]:
        """The strings at `rows`, in that order (what `get` gives, without its per-row numpy
        scalar reads: a search reads ~100 rows)."""
        if not rows:
            return []
        index = np.asarray(rows, dtype=np.int64)
        ends = self.ends[index].tolist()
        starts = np.where(index > 0, self.ends[index - 1], 0).tolist()
        data = self.data.data  # a memoryview: slices without numpy's per-call cost
        return [data[start:end].tobytes() for start, end in zip(starts, ends, strict=True)]

    def extend(self, items: Sequence[bytes]) -> None:
        joined = b"".join(items)
        count = len(items)
        if self.size + count > len(self.ends):
            ends = np.empty(max(2 * (self.size + count), 64), np.int64)
            ends[: self.size] = self.ends[: self.size]
            self.ends = ends
        if self.used + len(joined) > len(self.data):
            data = np.empty(max(2 * (self.used + len(joined)), 1024), np.uint8)
            data[: self.used] = self.data[: self.used]
            self.data = data
        self.data[self.used : self.used + len(joined)] = np.frombuffer(joined, np.uint8)
        lengths = np.fromiter((len(b) for b in items), np.int64, count)
        self.ends[self.size : self.size + count] = self.used + np.cumsum(lengths)
        self.size += count
        self.used += len(joined)

    def gather(self, index: npt.NDArray[np.int64]) -> Blob:
        """A new blob of the strings at `index`, in that order, copied one run of consecutive
        strings at a time. A compaction keeps rows in order, so its index is a few runs of
        many strings (one per source): an earlier byte-by-byte gather held ~40 bytes of
        index arrays per byte of text, 3.4 GB beyond the store's own memory to compact 300k
        passages (and the 1M-passage fill of `bench/memory.py` was killed for memory)."""
        if not len(index):
            return Blob(np.empty(0, np.uint8), np.empty(0, np.int64))
        ends = self.ends[: self.size]
        starts = np.concatenate(([0], ends[:-1]))[index]
        lengths = ends[index] - starts
        new_ends = np.cumsum(lengths, dtype=np.int64)
        data = np.empty(int(new_ends[-1]), np.uint8)
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        firsts = np.concatenate(([0], breaks)).tolist()
        lasts = (np.concatenate((breaks, [len(index)])) - 1).tolist()
        begin = starts.tolist()
        end = (starts + lengths).tolist()
        into = (new_ends - lengths).tolist()
        for first, last in zip(firsts, lasts, strict=True):
            low, high = begin[first], end[last]
            data[into[first] : into[first] + high - low] = self.data[low:high]
        return Blob(data, new_ends)

    def arrays(self) -> tuple[Bytes, Ends]:
        return self.data[: self.used], self.ends[: self.size]


class Rows:
    """A namespace's passages by row: chunk ids, texts, locations and sources as columns."""

    __slots__ = ("documents", "has_document", "ids", "locations", "source_of", "sources", "text")

    def __init__(self) -> None:
        """No rows (see `of` for rows held in arrays already)."""
        self.ids = Blob()
        self.text = Blob()
        self.documents = Blob()  # document ids, b"" where None (`has_document`)
        self.has_document: npt.NDArray[np.bool_] = np.empty(0, np.bool_)
        self.locations: Ints = np.empty((0, 3), np.int32)  # page, start line, end line
        self.source_of: Ints = np.empty(0, np.int32)  # index into `sources`
        self.sources: list[Revision] = []

    def __len__(self) -> int:
        return self.ids.size

    def __getitem__(self, i: int) -> Row:
        page, start, end = self.locations[i].tolist()
        location = Location(
            None if page == NONE else page,
            None if start == NONE else start,
            None if end == NONE else end,
            self.documents.get(i).decode("utf-8") if self.has_document[i] else None,
        )
        source = self.sources[int(self.source_of[i])]
        return Row(self.chunk_id(i), self.text.get(i), location, source)

    def many(self, rows: Sequence[int]) -> list[Row]:
        """The rows at `rows`, in that order (each what `self[i]` gives, read column by column
        for all of them at once)."""
        if not rows:
            return []
        index = np.asarray(rows, dtype=np.int64)
        documented = self.has_document[index].tolist()
        documents = iter(
            self.documents.get_many([r for r, d in zip(rows, documented, strict=True) if d])
        )
        sources = self.sources
        return [
            Row(
                chunk_id.decode("utf-8"),
                text,
                Location(
                    None if page == NONE else page,
                    None if start == NONE else start,
                    None if end == NONE else end,
                    next(documents).decode("utf-8") if has_document else None,
                ),
                sources[source],
            )
            for chunk_id, text, (page, start, end), has_document, source in zip(
                self.ids.get_many(rows),
                self.text.get_many(rows),
                self.locations[index].tolist(),
                documented,
                self.source_of[index].tolist(),
                strict=True,
            )
        ]

    def chunk_id(self, i: int) -> str:
        return self.ids.get(i).decode("utf-8")

    def chunk_ids(self, rows: Sequence[int]) -> list[str]:
        return [b.decode("utf-8") for b in self.ids.get_many(rows)]

    def append(self, source: Revision, rows: Sequence[tuple[str, bytes, Location]]) -> None:
        """One source revision's rows, at the end."""
        size, count = len(self), len(rows)
        if size + count > len(self.source_of):
            capacity = max(2 * (size + count), 64)
            self.source_of = _grown(self.source_of, size, (capacity,))
            self.locations = _grown(self.locations, size, (capacity, 3))
            self.has_document = _grown(self.has_document, size, (capacity,))
        self.source_of[size : size + count] = len(self.sources)
        self.sources.append(source)
        self.locations[size : size + count] = [
            [_field(loc.page), _field(loc.start_line), _field(loc.end_line)] for _, _, loc in rows
        ]
        self.has_document[size : size + count] = [loc.document_id is not None for _, _, loc in rows]
        self.documents.extend([(loc.document_id or "").encode("utf-8") for _, _, loc in rows])
        self.ids.extend([cid.encode("utf-8") for cid, _, _ in rows])
        self.text.extend([text for _, text, _ in rows])

    @classmethod
    def of(
        cls,
        blobs: tuple[Blob, Blob, Blob],
        has_document: npt.NDArray[np.bool_],
        locations: Ints,
        source_of: Ints,
        sources: list[Revision],
    ) -> Rows:
        """Rows over existing columns (chunk ids, texts and document ids, then the rest)."""
        rows = cls()
        rows.ids, rows.text, rows.documents = blobs
        rows.has_document, rows.locations, rows.source_of = has_document, locations, source_of
        rows.sources = sources
        return rows

    def gather(self, index: npt.NDArray[np.int64]) -> Rows:
        """New rows: these rows, in this order (a compaction)."""
        fresh = Rows()
        fresh.ids = self.ids.gather(index)
        fresh.text = self.text.gather(index)
        fresh.documents = self.documents.gather(index)
        fresh.has_document = self.has_document[index]
        fresh.locations = self.locations[index]
        # Only the sources still referenced, renumbered.
        used, inverse = np.unique(self.source_of[index], return_inverse=True)
        fresh.source_of = inverse.astype(np.int32)
        fresh.sources = [self.sources[i] for i in used.tolist()]
        return fresh


def _field(value: int | None) -> int:
    return NONE if value is None else value


def _grown(array: npt.NDArray[Any], size: int, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    grown = np.empty(shape, dtype=array.dtype)
    grown[:size] = array[:size]
    return grown

"""Index snapshots: the in-memory index of a corpus written to one file, mapped back at open.

Loading a large corpus from SQLite means reading every row and parsing every passage's term
frequencies (68.9 s for 1M passages on the bench machine), and each worker process of a host
held its own copy. A snapshot stores the index's arrays as they are in memory (vectors, chunk id
hashes, the passages' columns, the lexical index's lengths and postings); an open maps the file
copy-on-write (`MAP_PRIVATE`) and uses the arrays in place: nothing is parsed, pages are read
when a search first touches them, and processes mapping one file share its pages in the page
cache. Each array has room beyond its rows (a sparse hole in the file), so rows appended after
the open are written in place, into the process's private copies of those pages only.

SQLite stays the authority. A snapshot records, per source, the revision, document digest,
chunk count and commit generation it holds; an open keeps a source's rows only when SQLite has
that source at exactly that generation, revision, digest and count, drops the rest, and loads
from SQLite whatever changed since (the store's usual incremental reload). A snapshot that is
missing, unreadable, unsafe (a link, someone else's, writable by others), from another format,
corpus or descriptor is ignored: the index is loaded from SQLite and a new snapshot written.

When one is written: by `SqliteVectorStore` after a load from SQLite of many rows (the first
open of a store from before snapshots, or after a large change) and when enough rows changed
since the last snapshot, on a background thread; and at `close()` when anything changed. It is
written to a new private file (0600, `O_EXCL`), flushed, and renamed over the old one, so a
reader maps the old snapshot or the new one, never a part. Dead rows (replaced or deleted
revisions) are left out, their postings too (`_live_rows`): a snapshot holds only the text of
revisions live when it was written. A delete has the store rewrite the corpus's snapshot in
the background (`SqliteSnapshots._erase_from_snapshot`), so a deleted passage leaves the file
too, not only SQLite.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.files import check_store_file
from retrieval_host.adapters.sqlite.lexicon import KEY_BYTES, BasePostings, Lexicon
from retrieval_host.adapters.sqlite.rows import Blob, Revision, Rows
from retrieval_host.adapters.sqlite.segment import Segment, Span
from retrieval_host.core.errors import RetrievalError

_log = logging.getLogger(__name__)

MAGIC: Final = b"RHSNAP\x00\x01"
FORMAT: Final = 1
ALIGN: Final = 4096
# Room left after each array's rows (and text bytes), written as a hole: appends after an open
# land in place. The larger of a quarter of the rows and this many.
SPARE_ROWS: Final = 1024
SPARE_BYTES: Final = 1 << 20

# A namespace's arrays with one entry (or row) per passage, in file order; then its byte blobs.
_ROW_ARRAYS: Final = (
    "matrix",
    "hashes",
    "ids_ends",
    "text_ends",
    "documents_ends",
    "has_document",
    "locations",
    "source_of",
    "lengths",
)
_BYTE_ARRAYS: Final = ("ids", "text", "documents")


def snapshot_path(database: Path, corpus: str) -> Path:
    """Where the snapshot of `corpus` lives: beside the database, named after both."""
    digest = hashlib.sha256(corpus.encode("utf-8")).hexdigest()[:16]
    return database.with_name(f"{database.name}-index-{digest}")


# --- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One live source of a snapshot: where its rows are and what SQLite must still hold."""

    source_id: str
    revision: str
    document_sha256: str
    generation: int
    start: int
    stop: int

    def key(self) -> tuple[str, str, int, int]:
        return (self.revision, self.document_sha256, self.generation, self.stop - self.start)


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


def _postings(ns: NamespaceImage) -> BasePostings:
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


def _source_of(ns: NamespaceImage) -> npt.NDArray[np.int32]:
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


def _live_rows(ns: NamespaceImage) -> NamespaceImage:
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
    for name in _BYTE_ARRAYS:
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
    postings: dict[str, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]] = {}
    for term, (slots, tfs) in _postings(ns).items():
        moved = remap[slots]
        keep = moved >= 0
        if keep.any():
            postings[term] = [(moved[keep], tfs[keep])]
    return NamespaceImage(ns.namespace, live, arrays, sources, postings, None)


def write(
    path: Path,
    corpus: str,
    descriptor_json: str,
    generation: int,
    namespaces: Sequence[NamespaceImage],
) -> int:
    """Write a snapshot to `path` (atomically replacing it) of the namespaces' live rows;
    returns the bytes written."""
    namespaces = [_live_rows(ns) for ns in namespaces]
    header_namespaces: dict[str, Any] = {}
    blocks: list[tuple[int, Array]] = []
    offset = 0  # relative to the data start, fixed once the header's length is known

    def place(array: Array, room: int) -> list[Any]:
        nonlocal offset
        at = offset
        lazy = isinstance(array, _Taken | _Runs)
        blocks.append((at, array if lazy else np.ascontiguousarray(array)))
        offset = _aligned(at + room)
        return [at, array.dtype.str, list(array.shape)]

    for ns in namespaces:
        spare_rows = max(ns.size // 4, SPARE_ROWS)
        arrays = dict(ns.arrays)
        arrays["source_of"] = _source_of(ns)
        placed: dict[str, Any] = {}
        for name in _ROW_ARRAYS:
            array = arrays[name]
            extra = spare_rows + (1 if name.endswith("_ends") else 0)
            row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
            placed[name] = [*place(array, array.nbytes + extra * row_bytes), extra]
        for name in _BYTE_ARRAYS:
            array = arrays[name]
            extra = max(len(array) // 4, SPARE_BYTES)
            placed[name] = [*place(array, array.nbytes + extra), extra]
        base = _postings(ns)
        terms_data, terms_ends = base.terms.arrays()
        for name, array in (
            ("terms", terms_data),
            ("terms_ends", terms_ends),
            ("keys", base.keys),
            ("offsets", base.offsets),
            ("slots", base.slots),
            ("tfs", base.tfs),
        ):
            placed[name] = [*place(array, array.nbytes), 0]
        header_namespaces[ns.namespace] = {
            "size": ns.size,
            "arrays": placed,
            "sources": [
                [e.source_id, e.revision, e.document_sha256, e.generation, e.start, e.stop]
                for e in ns.sources
            ],
        }
    header = json.dumps(
        {
            "format": FORMAT,
            "corpus": corpus,
            "descriptor": descriptor_json,
            "generation": generation,
            "namespaces": header_namespaces,
        },
        separators=(",", ":"),
    ).encode("utf-8")
    data_start = _aligned(len(MAGIC) + 8 + len(header))
    total = data_start + offset
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{id(namespaces):x}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for at, array in blocks:
                out.seek(data_start + at)
                pieces = array.pieces() if isinstance(array, _Taken | _Runs) else (array,)
                for piece in pieces:
                    if piece.size:  # an empty view has no bytes to write (nor cast)
                        out.write(piece.data.cast("B"))
        os.ftruncate(fd, total)  # the room after the last array is a hole too
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    os.close(fd)
    os.replace(temporary, path)
    _sync_directory(path.parent)
    return total


def _aligned(value: int) -> int:
    return -(-value // ALIGN) * ALIGN


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Held (across processes: `flock` on `<snapshot>.lock`) while a process checks the
    snapshot at `path` and replaces it."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_temporaries(path: Path) -> None:
    """Remove what interrupted writes left (`<snapshot>.<pid>.<n>.tmp` of processes that are
    gone; another live process may be writing its own)."""
    for leftover in path.parent.glob(f"{path.name}.*.tmp"):
        pid = leftover.name[len(path.name) + 1 :].split(".", 1)[0]
        if pid.isdigit() and alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            leftover.unlink()


def alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- reading ----------------------------------------------------------------------------------


class SnapshotUnusable(Exception):
    """The snapshot cannot be used (the reason is logged; the index loads from SQLite)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A mapped snapshot: its generation and per namespace the columns and live sources."""

    generation: int
    namespaces: dict[str, tuple[int, dict[str, npt.NDArray[Any]], list[SourceEntry]]]
    identity: str  # this version of the file (device, inode, change time, size): a graph key


def read(
    path: Path, corpus: str, descriptor_json: str, dims: int, trusted_groups: frozenset[int]
) -> Snapshot | None:
    """The snapshot at `path` mapped copy-on-write, or None (missing or unusable: logged)."""
    try:
        return _read(path, corpus, descriptor_json, dims, trusted_groups)
    except FileNotFoundError:
        return None
    except (SnapshotUnusable, RetrievalError, OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("index snapshot %s not used: %s", path, exc)
        return None


def _read(
    path: Path, corpus: str, descriptor_json: str, dims: int, trusted_groups: frozenset[int]
) -> Snapshot:
    check_store_file(path, "index snapshot", trusted_groups)
    before = os.lstat(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise SnapshotUnusable("the file changed while it was opened")
        if st.st_size < len(MAGIC) + 8:
            raise SnapshotUnusable("the file is too short")
        mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    if mapped[: len(MAGIC)] != MAGIC:
        raise SnapshotUnusable("not a snapshot of this format")
    length = int.from_bytes(mapped[len(MAGIC) : len(MAGIC) + 8], "little")
    if length > st.st_size:
        raise SnapshotUnusable("the header is cut short")
    header = json.loads(mapped[len(MAGIC) + 8 : len(MAGIC) + 8 + length])
    if header.get("format") != FORMAT:
        raise SnapshotUnusable(f"format {header.get('format')!r}, not {FORMAT}")
    if header.get("corpus") != corpus or header.get("descriptor") != descriptor_json:
        raise SnapshotUnusable("written for another corpus or descriptor")
    data_start = _aligned(len(MAGIC) + 8 + length)
    namespaces: dict[str, tuple[int, dict[str, npt.NDArray[Any]], list[SourceEntry]]] = {}
    for namespace, entry in header["namespaces"].items():
        size = int(entry["size"])
        arrays: dict[str, npt.NDArray[Any]] = {}
        for name, (at, dtype, shape, extra) in entry["arrays"].items():
            full = [int(shape[0]) + int(extra), *map(int, shape[1:])]
            array = _view(mapped, data_start + int(at), np.dtype(dtype), full)
            arrays[name] = array
        if arrays["matrix"].shape[1:] != (dims,) or len(arrays["hashes"]) < size:
            raise SnapshotUnusable("its arrays do not match the corpus")
        sources = [
            SourceEntry(str(sid), str(rev), str(sha), int(gen), int(start), int(stop))
            for sid, rev, sha, gen, start, stop in entry["sources"]
        ]
        if any(not 0 <= e.start <= e.stop <= size for e in sources):
            raise SnapshotUnusable("a source's rows lie outside the snapshot")
        namespaces[str(namespace)] = (size, arrays, sources)
    return Snapshot(int(header["generation"]), namespaces, file_identity(st))


def file_identity(st: os.stat_result) -> str:
    """This version of a snapshot file (device, inode, modification time, size): the key of
    the graph files built from its rows."""
    key = f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def current_identity(path: Path) -> str | None:
    """The identity of the snapshot file at `path` now (None: there is none)."""
    try:
        return file_identity(os.stat(path))
    except OSError:
        return None


def written_generation(
    path: Path, corpus: str, descriptor_json: str, dims: int, trusted_groups: frozenset[int]
) -> int | None:
    """The commit generation of the snapshot at `path`, if it is one an open would use."""
    try:
        return _read(path, corpus, descriptor_json, dims, trusted_groups).generation
    except (SnapshotUnusable, RetrievalError, OSError, ValueError, KeyError, TypeError):
        return None


def _view(
    mapped: mmap.mmap, offset: int, dtype: np.dtype[Any], shape: list[int]
) -> npt.NDArray[Any]:
    count = int(np.prod(shape, dtype=np.int64))
    if offset % ALIGN or offset + count * dtype.itemsize > len(mapped):
        raise SnapshotUnusable("an array lies outside the file")
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)


# --- adopting a snapshot ------------------------------------------------------------------------


Listing = Mapping[tuple[str, str], tuple[str, str, int, int, Mapping[str, Any]]]


def segments(
    snapshot: Snapshot, dims: int, listing: Listing
) -> Iterator[tuple[str, Segment, list[tuple[str, int]]]]:
    """The snapshot's namespaces as segments, keeping only the sources SQLite still holds as
    the snapshot does (`listing`: (namespace, source id) -> (revision, document digest,
    generation, chunk count, metadata)); with each the (source id, generation) kept."""
    for namespace, (size, arrays, entries) in snapshot.namespaces.items():
        segment = Segment(dims)
        kept: list[tuple[str, int]] = []
        sources: list[Revision] = []
        live = np.zeros(len(arrays["lengths"]), dtype=np.bool_)
        for entry in entries:
            held = listing.get((namespace, entry.source_id))
            current = held is not None and held[:4] == entry.key()
            metadata = held[4] if held is not None and current else {}
            source = Revision(
                entry.source_id, entry.revision, entry.document_sha256, metadata, entry.generation
            )
            sources.append(source)
            if current:
                segment.spans[entry.source_id] = Span(
                    entry.revision, entry.start, entry.stop, source
                )
                live[entry.start : entry.stop] = True
                kept.append((entry.source_id, entry.generation))
        segment.matrix = arrays["matrix"]
        segment.hashes = arrays["hashes"]
        blobs = tuple(Blob(arrays[name], arrays[f"{name}_ends"], size) for name in _BYTE_ARRAYS)
        segment.rows = Rows.of(
            (blobs[0], blobs[1], blobs[2]),
            arrays["has_document"],
            arrays["locations"],
            arrays["source_of"],
            sources,
        )
        lexicon = Lexicon(
            BasePostings(
                Blob(arrays["terms"], arrays["terms_ends"]),
                arrays["keys"],
                arrays["offsets"],
                arrays["slots"],
                arrays["tfs"],
            )
        )
        lexicon.lengths = arrays["lengths"]
        lexicon.live = live
        lexicon.passages = int(np.count_nonzero(live))
        lexicon.total_length = int(arrays["lengths"][:size][live[:size]].sum(dtype=np.int64))
        segment.lexicon = lexicon
        segment.size = size
        segment.live = lexicon.passages
        if arrays["keys"].dtype != np.dtype(f"S{KEY_BYTES}"):
            raise SnapshotUnusable("its term keys have another width")
        yield namespace, segment, kept

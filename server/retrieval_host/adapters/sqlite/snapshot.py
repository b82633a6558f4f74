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
content fingerprint (passages, locations, provenance: `sources.fingerprint`), chunk count and
commit generation it holds; an open keeps a source's rows only when SQLite has that source at
exactly that generation, revision, digest, fingerprint and count, drops the rest, and loads
from SQLite whatever changed since (the store's usual incremental reload). Generations alone
do not name a write: a restored backup counts them again from its own, and its next writes
reuse numbers the snapshot recorded for other text (probe T, session 40: the snapshot's text
was served until the fingerprint joined the key, format 3). A snapshot of a generation past
the database's comes from a state the database does not hold (a restored backup, a new
database in the same place): it is not used, and a store that may write removes it and its
graph files (`SqliteSnapshots._adopt_snapshot`). A snapshot that is missing, unreadable,
unsafe (a link, someone else's, writable by others), from another format (an earlier
release's: its sources have no fingerprint), corpus or descriptor is ignored: the index is
loaded from SQLite and a new snapshot written.

A damaged one is too. The header carries its own CRC-32 and, per array, the CRC-32 of each
piece of its bytes (`snapshot_checks`); an open reads the whole file once and compares every
piece before a row is used. A mismatch (bit rot, a copy cut short or patched) makes the file
unusable, and a store that may write removes it, so that the next write does not take its
generation for a current one. A format 1 file (before checksums) is not used either: its
rows could not be checked, and a rewrite from them would have certified any damage they held
(a black-box test), so the first start of this format loads the index from SQLite once.

When one is written: by `SqliteVectorStore` after a load from SQLite of many rows (the first
open of a store from before snapshots, or after a large change) and when enough rows changed
since the last snapshot, on a background thread; and at `close()` when anything changed. It is
written to a new private file (0600, `O_EXCL`), flushed, and renamed over the old one, so a
reader maps the old snapshot or the new one, never a part. Dead rows (replaced or deleted
revisions) are left out, their postings too (`snapshot_image.live_rows`): a snapshot holds
only the text of revisions live when it was written. A delete has the store rewrite the
corpus's snapshot in the background (`SqliteSnapshots._erase_from_snapshot`), so a deleted
passage leaves the file too, not only SQLite.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite.files import check_store_file
from retrieval_host.adapters.sqlite.lexicon import KEY_BYTES, BasePostings, Lexicon
from retrieval_host.adapters.sqlite.rows import Blob, Revision, Rows
from retrieval_host.adapters.sqlite.segment import Segment, Span
from retrieval_host.adapters.sqlite.snapshot_checks import (
    Piece,
    pieces_of,
    placeholders,
    problem,
    written,
)
from retrieval_host.adapters.sqlite.snapshot_image import (
    BYTE_ARRAYS,
    Array,
    NamespaceImage,
    SourceEntry,
    live_rows,
    pieces,
    postings,
    source_of,
)
from retrieval_host.core.errors import RetrievalError

_log = logging.getLogger(__name__)

# The magic names the prefix's layout (magic, header length, header CRC-32: since format 2);
# the header's `format` names the rest. Format 3: each source's entry has its fingerprint.
MAGIC: Final = b"RHSNAP\x00\x02"
FORMAT: Final = 3
# The magic, the header's length (8 bytes) and its CRC-32 (4 bytes).
_PREFIX: Final = len(MAGIC) + 8 + 4
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


def snapshot_path(database: Path, corpus: str) -> Path:
    """Where the snapshot of `corpus` lives: beside the database, named after both."""
    digest = hashlib.sha256(corpus.encode("utf-8")).hexdigest()[:16]
    return database.with_name(f"{database.name}-index-{digest}")


# --- writing ----------------------------------------------------------------------------------


def write(
    path: Path,
    corpus: str,
    descriptor_json: str,
    generation: int,
    namespaces: Sequence[NamespaceImage],
) -> int:
    """Write a snapshot to `path` (atomically replacing it) of the namespaces' live rows;
    returns the bytes written."""
    namespaces = [live_rows(ns) for ns in namespaces]
    header_namespaces: dict[str, Any] = {}
    # Each block with the list its pieces' checksums go into (placeholders of the same width
    # until the block is written: the header's length is fixed before the data).
    blocks: list[tuple[int, Array, list[str]]] = []
    offset = 0  # relative to the data start, fixed once the header's length is known

    def place(array: Array, room: int, extra: int) -> list[Any]:
        nonlocal offset
        at = offset
        checks = placeholders(array.nbytes)
        blocks.append((at, array, checks))
        offset = _aligned(at + room)
        return [at, array.dtype.str, list(array.shape), extra, checks]

    for ns in namespaces:
        spare_rows = max(ns.size // 4, SPARE_ROWS)
        arrays = dict(ns.arrays)
        arrays["source_of"] = source_of(ns)
        placed: dict[str, Any] = {}
        for name in _ROW_ARRAYS:
            array = arrays[name]
            extra = spare_rows + (1 if name.endswith("_ends") else 0)
            row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
            placed[name] = place(array, array.nbytes + extra * row_bytes, extra)
        for name in BYTE_ARRAYS:
            array = arrays[name]
            extra = max(len(array) // 4, SPARE_BYTES)
            placed[name] = place(array, array.nbytes + extra, extra)
        base = postings(ns)
        terms_data, terms_ends = base.terms.arrays()
        for name, array in (
            ("terms", terms_data),
            ("terms_ends", terms_ends),
            ("keys", base.keys),
            ("offsets", base.offsets),
            ("slots", base.slots),
            ("tfs", base.tfs),
        ):
            placed[name] = place(array, array.nbytes, 0)
        header_namespaces[ns.namespace] = {
            "size": ns.size,
            "arrays": placed,
            "sources": [
                [
                    e.source_id,
                    e.revision,
                    e.document_sha256,
                    e.fingerprint,
                    e.generation,
                    e.start,
                    e.stop,
                ]
                for e in ns.sources
            ],
        }
    content = {
        "format": FORMAT,
        "corpus": corpus,
        "descriptor": descriptor_json,
        "generation": generation,
        "namespaces": header_namespaces,
    }
    header = _header_bytes(content)
    data_start = _aligned(_PREFIX + len(header))
    total = data_start + offset
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{id(namespaces):x}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(bytes(data_start))  # the header goes here once the checksums are known
            for at, array, checks in blocks:
                out.seek(data_start + at)
                checks[:] = written(out, pieces(array))
            final = _header_bytes(content)
            if len(final) != len(header):
                raise AssertionError("the snapshot header changed length")
            out.seek(0)
            out.write(_prefix(final) + final)
        os.ftruncate(fd, total)  # the room after the last array is a hole too
        if on_tmpfs(path.parent):
            # On tmpfs a hole is taken from memory when the mapping first touches it, and a
            # full tmpfs then kills the host with SIGBUS (a black-box test): its room is
            # allocated here instead, where a full tmpfs is an error the writer logs.
            os.posix_fallocate(fd, 0, total)
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


def on_tmpfs(directory: Path) -> bool:
    """Whether `directory` lies on a tmpfs (`/dev/shm`, a Kubernetes `emptyDir` in memory), by
    the longest mount point above it in `/proc/self/mountinfo` (False where there is none)."""
    try:
        table = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    target = os.path.realpath(directory)
    best, kind = "", ""
    for line in table.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mount = parts[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, rest.split()[0]
    return kind == "tmpfs"


def _header_bytes(content: Mapping[str, Any]) -> bytes:
    return json.dumps(content, separators=(",", ":")).encode("utf-8")


def _prefix(header: bytes) -> bytes:
    return MAGIC + len(header).to_bytes(8, "little") + zlib.crc32(header).to_bytes(4, "little")


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


# What reading a snapshot that does not parse as one raises (a header of another shape: a
# short array spec was an IndexError that stopped the start, a black-box test).
_UNUSABLE: Final = (
    SnapshotUnusable,
    RetrievalError,
    OSError,
    ValueError,
    KeyError,
    TypeError,
    IndexError,
)


class SnapshotDamaged(SnapshotUnusable):
    """The snapshot's bytes do not match its checksums (`identity`: the version of the file)."""

    def __init__(self, message: str, identity: str) -> None:
        super().__init__(message)
        self.identity = identity


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A mapped snapshot: its generation and per namespace the columns and live sources."""

    generation: int
    namespaces: dict[str, tuple[int, dict[str, npt.NDArray[Any]], list[SourceEntry]]]
    identity: str  # this version of the file (device, inode, change time, size): a graph key


def read(
    path: Path,
    corpus: str,
    descriptor_json: str,
    dims: int,
    trusted_groups: frozenset[int],
    *,
    remove_damaged: bool = False,
) -> Snapshot | None:
    """The snapshot at `path` mapped copy-on-write, its bytes checked, or None (missing or
    unusable: logged). `remove_damaged`: a file whose bytes fail their checks is removed
    (unless another has replaced it meanwhile)."""
    try:
        return _read(path, corpus, descriptor_json, dims, trusted_groups, verify=True)
    except FileNotFoundError:
        return None
    except SnapshotDamaged as exc:
        _log.error("index snapshot %s not used: it is damaged (%s)", path, exc)
        if remove_damaged:
            with contextlib.suppress(OSError), writing(path):
                if current_identity(path) == exc.identity:
                    path.unlink()
        return None
    except _UNUSABLE as exc:
        _log.warning("index snapshot %s not used: %s", path, exc)
        return None


def _read(
    path: Path,
    corpus: str,
    descriptor_json: str,
    dims: int,
    trusted_groups: frozenset[int],
    *,
    verify: bool,
) -> Snapshot:
    check_store_file(path, "index snapshot", trusted_groups)
    before = os.lstat(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise SnapshotUnusable("the file changed while it was opened")
        if st.st_size < _PREFIX:
            raise SnapshotUnusable("the file is too short")
        if st.st_blocks * 512 < st.st_size and on_tmpfs(path.parent):
            raise SnapshotUnusable("it has holes on a tmpfs, which a full tmpfs turns into SIGBUS")
        mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
        snap, pieces = _mapped(mapped, st, corpus, descriptor_json, dims)
        found = problem(fd, pieces) if verify else None
        if found is not None:
            raise SnapshotDamaged(found, snap.identity)
    finally:
        os.close(fd)
    return snap


def _mapped(
    mapped: mmap.mmap, st: os.stat_result, corpus: str, descriptor_json: str, dims: int
) -> tuple[Snapshot, list[Piece]]:
    """The snapshot's arrays as views of `mapped`, and the pieces of the file to check
    (offset, length, expected CRC-32, what they are of)."""
    identity = file_identity(st)
    if mapped[: len(MAGIC)] != MAGIC:
        raise SnapshotUnusable("not a snapshot of this format (or one written before checksums)")
    length = int.from_bytes(mapped[len(MAGIC) : len(MAGIC) + 8], "little")
    if _PREFIX + length > st.st_size:
        raise SnapshotUnusable("the header is cut short")
    header_bytes = mapped[_PREFIX : _PREFIX + length]
    expected = int.from_bytes(mapped[_PREFIX - 4 : _PREFIX], "little")
    if zlib.crc32(header_bytes) != expected:
        raise SnapshotDamaged("its header does not match its checksum", identity)
    header = json.loads(header_bytes)
    if header.get("format") != FORMAT:
        raise SnapshotUnusable(f"format {header.get('format')!r}, not {FORMAT}")
    if header.get("corpus") != corpus or header.get("descriptor") != descriptor_json:
        raise SnapshotUnusable("written for another corpus or descriptor")
    data_start = _aligned(_PREFIX + length)
    namespaces: dict[str, tuple[int, dict[str, npt.NDArray[Any]], list[SourceEntry]]] = {}
    pieces: list[Piece] = []
    for namespace, entry in header["namespaces"].items():
        size = int(entry["size"])
        arrays: dict[str, npt.NDArray[Any]] = {}
        for name, spec in entry["arrays"].items():
            at, dtype, shape, extra = int(spec[0]), np.dtype(spec[1]), spec[2], int(spec[3])
            full = [int(shape[0]) + extra, *map(int, shape[1:])]
            arrays[name] = _view(mapped, data_start + at, dtype, full)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            found = pieces_of(name, data_start + at, nbytes, [str(c) for c in spec[4]])
            if found is None:
                raise SnapshotDamaged(f"its {name} array has the wrong checks", identity)
            pieces += found
        if arrays["matrix"].shape[1:] != (dims,) or len(arrays["hashes"]) < size:
            raise SnapshotUnusable("its arrays do not match the corpus")
        sources = [
            SourceEntry(str(sid), str(rev), str(sha), int(gen), int(start), int(stop), str(fp))
            for sid, rev, sha, fp, gen, start, stop in entry["sources"]
        ]
        if any(not 0 <= e.start <= e.stop <= size for e in sources):
            raise SnapshotUnusable("a source's rows lie outside the snapshot")
        namespaces[str(namespace)] = (size, arrays, sources)
    return Snapshot(int(header["generation"]), namespaces, identity), pieces


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
    """The commit generation of the snapshot at `path`, if it is one an open would use (its
    bytes unchecked: a damaged one is removed by the open that finds it)."""
    try:
        found = _read(path, corpus, descriptor_json, dims, trusted_groups, verify=False)
    except _UNUSABLE:
        return None
    return found.generation


def _view(
    mapped: mmap.mmap, offset: int, dtype: np.dtype[Any], shape: list[int]
) -> npt.NDArray[Any]:
    count = int(np.prod(shape, dtype=np.int64))
    if offset % ALIGN or offset + count * dtype.itemsize > len(mapped):
        raise SnapshotUnusable("an array lies outside the file")
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)


# --- adopting a snapshot ------------------------------------------------------------------------


Listing = Mapping[tuple[str, str], tuple[str, str, str, int, int, Mapping[str, Any], str | None]]


def segments(
    snapshot: Snapshot, dims: int, listing: Listing
) -> Iterator[tuple[str, Segment, list[tuple[str, int]]]]:
    """The snapshot's namespaces as segments, keeping only the sources SQLite still holds as
    the snapshot does (`listing`: (namespace, source id) -> (revision, document digest,
    content fingerprint, generation, chunk count, metadata, media type); an entry without a
    fingerprint matches none); with each the (source id, generation) kept. The metadata and
    media type come from SQLite, not the file: a snapshot of an earlier release serves them
    as well."""
    for namespace, (size, arrays, entries) in snapshot.namespaces.items():
        segment = Segment(dims)
        kept: list[tuple[str, int]] = []
        sources: list[Revision] = []
        live = np.zeros(len(arrays["lengths"]), dtype=np.bool_)
        for entry in entries:
            held = listing.get((namespace, entry.source_id))
            current = held is not None and bool(entry.fingerprint) and held[:5] == entry.key()
            metadata = held[5] if held is not None and current else {}
            media_type = held[6] if held is not None and current else None
            source = Revision(
                entry.source_id,
                entry.revision,
                entry.document_sha256,
                metadata,
                entry.generation,
                media_type,
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
        blobs = tuple(Blob(arrays[name], arrays[f"{name}_ends"], size) for name in BYTE_ARRAYS)
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

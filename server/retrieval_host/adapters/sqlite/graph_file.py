"""Approximate search graphs shared between processes through a file beside the index snapshot.

Processes that mapped the same snapshot file (the host's workers) number its rows alike, so a
graph of those rows serves them all: the first to need one builds it and writes it to
`<snapshot>-graph-<sha256(namespace)[:16]>-<snapshot identity>`, the others map that file
(usearch's `view`: shared pages, nothing copied) instead of building their own. A lock file
(`O_EXCL`, holding the builder's pid) keeps a second process from building the same graph
at the same time; one left by a process that is gone is taken over. The file is written as
the snapshot is (0600, a temporary name, fsync, rename); files of other snapshot versions of
the namespace are removed when a new one is written (a process still mapping one keeps its
pages). A file that is missing, unsafe (a link, another owner, writable by others) or does not
fit the snapshot is not used: the process builds its own graph.

Beside it, `<graph file>.unreachable` holds the build's self-check (`approximate`: the members
the graph cannot reach, as int64 rows) and the identity of the graph file it is of (a digest of
its inode, size and modification time, taken from the written file before it is renamed into
place, and written first): a process that maps that very file (the same identity before and
after mapping it) reads the check instead of repeating it; one that finds no check, or one of
another file (two builders racing, an earlier release's file), checks the graph itself, and
writes its check for the others. The check is an optimisation: failing to write or read it
only costs the check again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval_host.adapters.sqlite.files import check_store_file
from retrieval_host.adapters.sqlite.scan import Index, Matrix
from retrieval_host.adapters.sqlite.snapshot import alive, current_identity, writing
from retrieval_host.core.errors import RetrievalError

_log = logging.getLogger("retrieval_host.store")


@dataclass(frozen=True, slots=True)
class Origin:
    """A segment whose rows were mapped from an index snapshot: the graph file its rows below
    `rows` share, while the segment still reads that mapped array (`matrix`; a compaction
    replaces it, and the segment then builds its graphs alone)."""

    path: Path
    rows: int
    matrix: Matrix
    trusted_groups: frozenset[int]
    snapshot: Path  # the snapshot file, and the identity of the version of it mapped
    identity: str


def graph_path(snapshot: Path, namespace: str, identity: str) -> Path:
    digest = hashlib.sha256(namespace.encode()).hexdigest()[:16]
    return snapshot.with_name(f"{snapshot.name}-graph-{digest}-{identity}")


def view(origin: Origin, load: Any) -> tuple[Any, int] | None:
    """The graph file mapped read-only (usearch `Index.restore(view=True)`) and its identity,
    or None when it is missing or unusable (logged)."""
    path = origin.path
    try:
        check_store_file(path, "approximate search graph", origin.trusted_groups)
        if not path.exists():
            return None
        before = _identity(os.stat(path))
        index = load(str(path), view=True)
        if index is None:
            raise ValueError("not a usearch index")
        if _identity(os.stat(path)) != before:
            return None  # replaced while it was mapped: the caller builds or looks again
        keys = np.asarray(index.keys, dtype=np.uint64)
        fits = index.ndim == origin.matrix.shape[1] and len(index) <= origin.rows
        if not fits or (len(keys) and int(keys.max()) >= origin.rows):
            raise ValueError("it does not fit the snapshot's rows")
        return index, before
    except (OSError, RuntimeError, ValueError, RetrievalError) as exc:
        _log.warning("approximate search graph %s not used: %s", path, exc)
        return None


def lock(origin: Origin) -> Path | None:
    """Take the build lock of this graph file (None: a live process holds it)."""
    path = origin.path.with_name(origin.path.name + ".lock")
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            try:
                holder = int(path.read_text() or "0")
            except (OSError, ValueError):
                holder = 0
            if holder and alive(holder):
                return None
            with contextlib.suppress(OSError):
                path.unlink()  # left by a process that is gone
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return path
    return None


def _unreachable_path(origin: Origin) -> Path:
    return origin.path.with_name(origin.path.name + ".unreachable")


def _identity(stat: os.stat_result) -> int:
    """A graph file's identity: its inode, size and modification time (kept by a rename),
    digested to one int64."""
    digest = hashlib.sha256(f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return int.from_bytes(digest.digest()[:8], "little", signed=True)


def write_unreachable(origin: Origin, rows: Index, identity: int) -> None:
    """Write the self-check of the graph file of that identity. Failing is logged: the check
    only saves the processes that map the graph from repeating it."""

    def save(name: str) -> None:
        record = np.concatenate([np.array([identity], dtype=np.int64), rows.astype(np.int64)])
        with open(name, "wb") as out:  # a file, not a name: np.save would add `.npy`
            np.save(out, record, allow_pickle=False)

    try:
        _write_file(_unreachable_path(origin), save)
    except OSError as exc:
        _log.warning("approximate search graph check of %s not written: %s", origin.path, exc)


def read_unreachable(origin: Origin, identity: int) -> Index | None:
    """The self-check of the graph file of that identity (the one mapped), or None: missing,
    of another file, or unusable (then the caller checks the graph itself)."""
    path = _unreachable_path(origin)
    try:
        check_store_file(path, "approximate search graph check", origin.trusted_groups)
        if not path.exists():
            return None
        record = np.load(path, allow_pickle=False)
        if record.dtype != np.int64 or record.ndim != 1 or len(record) < 1:
            raise ValueError("not a graph check")
        if int(record[0]) != identity:
            return None  # of another build of the graph
        rows: Index = record[1:]
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= origin.rows):
            raise ValueError("it does not fit the snapshot's rows")
        return rows
    except Exception as exc:  # any unreadable file (truncated: EOFError) is only checked again
        _log.warning("approximate search graph check %s not used: %s", path, exc)
        return None


def _write_file(
    path: Path, save: Callable[[str], None], before: Callable[[int], None] | None = None
) -> None:
    """`save(temporary path)`, then 0600 and fsync; `before(the written file's identity)`;
    then rename over `path`."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        save(str(temporary))
        os.chmod(temporary, 0o600)
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
            identity = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        if before is not None:
            before(identity)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def write(origin: Origin, index: Any, unreachable: Index) -> bool:
    """Write the graph file (0600, temporary name, fsync, rename), its self-check first, and
    remove the namespace's graph files of other snapshot versions; False, writing nothing,
    when the snapshot file is no longer the version the graph's rows were mapped from (a
    delete rewrote it during the build: the graph holds the deleted rows' vectors, and the
    rewrite had removed the graph files; a black-box test found one written after it)."""
    path = origin.path
    with writing(origin.snapshot):  # the snapshot's writers remove graph files under it
        if current_identity(origin.snapshot) != origin.identity:
            return False
        _write_file(
            path,
            index.save,
            lambda identity: write_unreachable(origin, unreachable, identity),
        )
        _remove(
            path.parent,
            path.name.rsplit("-", 1)[0] + "-",
            {path.name, _unreachable_path(origin).name},
        )
    return True


def remove_graphs(snapshot: Path) -> None:
    """Remove the graph files of every namespace of this snapshot (a new version of it was
    written: none fits it), but not lock files nor a live process's temporary files."""
    _remove(snapshot.parent, f"{snapshot.name}-graph-", set())


def _remove(directory: Path, prefix: str, keep: set[str]) -> None:
    for other in directory.glob(f"{prefix}*"):
        if other.name in keep or other.name.endswith(".lock"):
            continue
        if other.name.endswith(".tmp"):  # `<graph>.<pid>.tmp`: only of a process that is gone
            pid = other.name[:-4].rsplit(".", 1)[-1]
            if not pid.isdigit() or alive(int(pid)):
                continue
        with contextlib.suppress(OSError):
            other.unlink()

"""Online backup of the host's SQLite store, safe while the host is serving and writing.

    python sqlite_backup.py SOURCE DEST

Copies SOURCE with SQLite's online backup API (through apsw, whose bundled SQLite is the one
the host itself requires), checks the copy with `PRAGMA integrity_check`, and moves it to DEST
atomically (mode 0600). An existing DEST is replaced only if it is an earlier backup of the same
kind of database (its `application_id`, a `user_version` no newer than SOURCE's) with no index
snapshots beside it. Never copy a live WAL database with `cp`: the committed state is split
between the database file and its `-wal`, and a file copy taken mid-write may be unusable.

In the container image it is /opt/retrieval-host/libexec/sqlite_backup.py (run it with
/opt/retrieval-host/bin/python, as the host's user: the store's files are 0600).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import apsw

_SQLITE_HEADER = b"SQLite format 3\x00"
_COMPANIONS = ("-wal", "-shm", "-journal")
# `<database>-index-<digest>` (and its lock, graphs and temporaries): the host's index snapshots,
# named by `retrieval_host.adapters.sqlite.snapshot.snapshot_path`.
_INDEX_SNAPSHOTS = "-index-*"


class BackupError(Exception):
    """The backup could not be taken or did not verify; DEST is left untouched."""


def backup(source: Path, dest: Path, *, busy_timeout_ms: int = 10_000) -> int:
    """Copy `source` to `dest` through the online backup API; return the page count copied."""
    if not source.is_file():
        raise BackupError(f"{source} is not a file")
    if not _is_sqlite(source):
        raise BackupError(f"{source} is not a SQLite database")
    dest_dir = dest.parent if str(dest.parent) else Path(".")
    if not dest_dir.is_dir():
        raise BackupError(f"the folder {dest_dir} does not exist")
    # DEST replaced by the copy: never the live database or one of its companion files (the
    # host then answered 503 on every write until restarted), never a file that is not an
    # earlier backup (a mistyped `host.json`).
    live = source.resolve()
    companions = {live, *(live.with_name(live.name + end) for end in _COMPANIONS)}
    if dest.resolve() in companions or (dest.exists() and dest.samefile(source)):
        raise BackupError(f"{dest} is the live database (or one of its files), not a backup")
    if any(dest.with_name(dest.name + end).exists() for end in _COMPANIONS):
        # A backup is one self-contained file: one with a `-wal` or `-shm` beside it is a
        # database in use (`runs.db` typed for the backup's name, a review).
        raise BackupError(f"{dest} is a database in use (it has a -wal or -shm), not a backup")
    if dest.is_dir():
        raise BackupError(f"{dest} is a directory: name the backup file (e.g. {dest}/backup.db)")
    if dest.exists() and not (dest.is_file() and (_is_sqlite(dest) or not dest.stat().st_size)):
        raise BackupError(f"{dest} exists and is not a SQLite backup: it is left as it is")
    if any(dest.parent.glob(f"{glob.escape(dest.name)}{_INDEX_SNAPSHOTS}")):
        # The host keeps its index snapshots beside its live vector store, even while stopped;
        # a backup never has them (probe F1, session 43: the stopped host's index replaced).
        raise BackupError(
            f"{dest} is a host's store (it has {dest.name}{_INDEX_SNAPSHOTS} beside it), "
            "not a backup"
        )
    # An earlier backup is replaced only by a backup of the same kind of database, checked on
    # the copy below (the header of a live WAL source may lag behind its -wal).
    earlier = _identity(dest) if dest.exists() and dest.stat().st_size else None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # Read-write without create: a mistyped path fails instead of backing up an empty file.
        src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READWRITE)
        try:
            src.set_busy_timeout(busy_timeout_ms)
            dst = apsw.Connection(str(tmp))
            try:
                # One step copies a consistent snapshot under a read transaction; WAL writers
                # carry on meanwhile (only checkpoints wait until the copy ends).
                with dst.backup("main", src, "main") as job:
                    job.step(-1)
                    pages = int(job.page_count)
                result = dst.execute("PRAGMA integrity_check").fetchall()
                if result != [("ok",)]:
                    raise BackupError(f"the copy failed its integrity check: {result[:3]}")
                # The copy is a single self-contained file: fold any WAL content back in.
                dst.execute("PRAGMA journal_mode=DELETE").fetchall()
            finally:
                dst.close()
        finally:
            src.close()
        if earlier is not None:
            _check_replaces(dest, earlier, _identity(tmp))
        tmp.chmod(0o600)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except apsw.Error as exc:
        raise BackupError(f"backup of {source} failed: {exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return pages


def _identity(path: Path) -> tuple[int, int]:
    """The `application_id` and `user_version` in the file's header (offsets 68 and 60).

    Read from the bytes, not through SQLite: opening a WAL database, even read-only, creates
    its -wal and -shm, and DEST must be left as it was.
    """
    with open(path, "rb") as handle:
        header = handle.read(100)
    if len(header) < 100:
        raise BackupError(f"{path} exists and is not a SQLite backup: it is left as it is")
    user_version = int.from_bytes(header[60:64], "big")
    application_id = int.from_bytes(header[68:72], "big")
    return application_id, user_version


def _check_replaces(dest: Path, earlier: tuple[int, int], copy: tuple[int, int]) -> None:
    """Refuse to replace `dest` unless it is an earlier backup of the same kind of database.

    The host's two databases differ by `application_id` (the vector store and the run store):
    `runs.db` backed up onto a stopped host's `retrieval.sqlite` replaced its index (probe F1,
    session 43). A newer `user_version` is a backup taken by a newer host: kept too.
    """
    (dest_app, dest_version), (app, version) = earlier, copy
    if dest_app != app:
        raise BackupError(
            f"{dest} is another kind of database (application_id {dest_app:#x}, the source's "
            f"is {app:#x}), not an earlier backup of it: it is left as it is"
        )
    if dest_version > version:
        raise BackupError(
            f"{dest} has a newer schema (user_version {dest_version}) than the source "
            f"({version}): it is left as it is"
        )


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: SOURCE DEST."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("source", type=Path, help="the live database (store.sqlitePath)")
    parser.add_argument("dest", type=Path, help="the backup file to write (replaced atomically)")
    args = parser.parse_args(argv)
    try:
        pages = backup(args.source, args.dest)
    except BackupError as exc:
        print(f"sqlite_backup: {exc}", file=sys.stderr)
        return 1
    print(f"backed up {args.source} to {args.dest} ({pages} pages, integrity ok)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Online backup of the host's SQLite store, safe while the host is serving and writing.

    python sqlite_backup.py SOURCE DEST

Copies SOURCE with SQLite's online backup API (through apsw, whose bundled SQLite is the one
the host itself requires), checks the copy with `PRAGMA integrity_check`, and moves it to DEST
atomically (mode 0600). Never copy a live WAL database with `cp`: the committed state is split
between the database file and its `-wal`, and a file copy taken mid-write may be unusable.

In the container image it is /opt/retrieval-host/libexec/sqlite_backup.py (run it with
/opt/retrieval-host/bin/python, as the host's user: the store's files are 0600).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import apsw

_SQLITE_HEADER = b"SQLite format 3\x00"
_COMPANIONS = ("-wal", "-shm", "-journal")


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

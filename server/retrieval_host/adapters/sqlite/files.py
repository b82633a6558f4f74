"""POSIX checks that keep the SQLite store in a private directory.

The database, its sidecars and the directories above it must be under the control of the user
running the host (or root). If anyone else could write to one of them, they could swap the file
for a link, plant a `-wal` that SQLite would replay, or rename a directory out from under us.

Policy (each point is what the checks enforce, and why):

- The database file and any `-wal`, `-shm` or `-journal` sidecar that exists must be a regular
  file (never a symbolic link), owned by the effective uid, and not writable by group or others.
  The database must have one hard link: SQLite names its sidecars after the path it was given,
  so two names for one file would let two connections miss each other's locks.
- The database's own directory must be owned by the effective uid or root and not writable by
  group or others, sticky or not: a shared directory lets other users create the sidecar names.
- Each ancestor directory up to `/` must be owned by the effective uid or root and not writable
  by group or others, with one exception: a root-owned directory with the sticky bit (`/tmp`)
  is accepted as an ancestor, because the sticky bit stops other users from renaming or removing
  the entry below it, which is checked in turn.
- Symbolic links in the directory part of the path are resolved once; the real directories are
  checked and the resolved path is what gets opened, so a link changing later does not redirect
  the store while it is open.
- A missing database directory (only the last one) is created with mode 0700, a missing
  database file with mode 0600. SQLite gives the sidecars the database file's mode.
- Group write permission is accepted only from the *trusted groups* a store is opened with
  (`trusted_groups`; none by default, `store.trustOwnGroup` in the host settings): the host
  process's own effective and supplementary groups, for volumes provisioned group-writable for
  the pod (Kubernetes `fsGroup`, OpenShift's arbitrary uid in gid 0). Whoever else is in such a
  group could tamper with the store, which is why it is a setting: on a machine where a
  primary group is shared between users, leave it off. Write permission for others is never
  accepted.

On systems without POSIX ownership (Windows) the ownership and mode checks are skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason, UnsafeStoreReason

SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")


def _unsafe(detail: str, reason: UnsafeStoreReason) -> RetrievalError:
    return RetrievalError(ErrorCode.UNSAFE_STORE, detail, reason=reason)


def _posix() -> bool:
    return os.name == "posix" and hasattr(os, "geteuid")


def own_groups() -> frozenset[int]:
    """The effective and supplementary groups of this process (`trusted_groups` when the
    host trusts its own group)."""
    if not _posix():
        return frozenset()
    return frozenset({os.getegid(), *os.getgroups()})


def _shared(st: os.stat_result, trusted_groups: frozenset[int]) -> bool:
    """Writable by someone other than the owner and the trusted groups."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and st.st_gid not in trusted_groups


def check_store_file(path: Path, what: str, trusted_groups: frozenset[int] = frozenset()) -> None:
    """Refuse a database or sidecar file that is a link, shared, or owned by someone else.

    A missing file passes: SQLite creates sidecars on demand with the database's mode.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _unsafe(
            f"{what} {path} is a symbolic link; the store refuses links.", UnsafeStoreReason.SYMLINK
        )
    if not stat.S_ISREG(st.st_mode):
        raise _unsafe(f"{what} {path} is not a regular file.", UnsafeStoreReason.NOT_REGULAR_FILE)
    if not _posix():
        return
    euid = os.geteuid()
    if st.st_uid != euid:
        raise _unsafe(
            f"{what} {path} is owned by uid {st.st_uid}, not by the user running the host "
            f"(uid {euid}).",
            UnsafeStoreReason.FOREIGN_OWNER,
        )
    if _shared(st, trusted_groups):
        raise _unsafe(
            f"{what} {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}); make it 0600.",
            UnsafeStoreReason.WRITABLE_BY_OTHERS,
        )


def check_directory_chain(directory: Path, trusted_groups: frozenset[int] = frozenset()) -> None:
    """Check the (already resolved) database directory and every ancestor up to `/`."""
    if not _posix():
        return
    euid = os.geteuid()
    current = directory
    own_directory = True
    while True:
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):
            raise _unsafe(f"{current} is not a directory.", UnsafeStoreReason.NOT_A_DIRECTORY)
        if st.st_uid not in (euid, 0):
            raise _unsafe(
                f"directory {current} is owned by uid {st.st_uid}; every directory above the "
                f"database must belong to the host's user (uid {euid}) or root.",
                UnsafeStoreReason.FOREIGN_OWNER,
            )
        shared = _shared(st, trusted_groups)
        sticky_root = bool(st.st_mode & stat.S_ISVTX) and st.st_uid == 0
        if shared and (own_directory or not sticky_root):
            where = "the database directory" if own_directory else "directory"
            raise _unsafe(
                f"{where} {current} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}); keep the database in a "
                "private (0700) directory, or trust the host's own group (store.trustOwnGroup) "
                "on a volume provisioned for it.",
                UnsafeStoreReason.WRITABLE_BY_OTHERS,
            )
        parent = current.parent
        if parent == current:
            return
        current = parent
        own_directory = False


def _ensure_directory(directory: Path, trusted_groups: frozenset[int]) -> None:
    """Create the database's own directory (0700) when it is missing; never its ancestors."""
    if os.path.lexists(directory):
        return
    parent = Path(os.path.realpath(directory.parent))
    if os.path.lexists(parent) and not parent.is_dir():  # it exists: "create it" would mislead
        raise _unsafe(f"{parent} is not a directory.", UnsafeStoreReason.NOT_A_DIRECTORY)
    if not parent.is_dir():
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the directory {directory.parent} does not exist; create it first.",
            reason=StoreUnavailableReason.MISSING_DIRECTORY,
        )
    # The parent must be safe before anything is created inside it.
    check_directory_chain(parent, trusted_groups)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        return  # a concurrent opener created it: checked below
    except OSError as exc:
        raise _cannot_create(directory, exc) from exc
    os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask


def _cannot_create(path: Path, exc: OSError) -> RetrievalError:
    """A typed start failure for a store that cannot be made at `path` (a read-only volume,
    a folder the host may not write): it was an untyped OSError and a traceback."""
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"cannot create {path}: {exc.strerror or type(exc).__name__}. A store is created on "
        "a writable volume; one served from a read-only volume needs store.readOnly, and its "
        "run records a writable runs.sqlitePath.",
        reason=StoreUnavailableReason.UNWRITABLE,
    )


def _create_database_file(path: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return  # created concurrently; the caller checks it like any existing file
    except OSError as exc:
        raise _cannot_create(path, exc) from exc
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def prepare_database_path(
    path: str | os.PathLike[str], trusted_groups: frozenset[int] = frozenset()
) -> Path:
    """Check (and create if missing) a private database location; return the path to open.

    Raises `UNSAFE_STORE` naming the first problem found, or `STORE_UNAVAILABLE` when the
    directory above the database's own directory does not exist. Group write permission is
    accepted only for `trusted_groups` (see the module docstring).
    """
    given = Path(os.path.abspath(os.fspath(path)))
    if given.name in ("", ".", ".."):
        raise RetrievalError(ErrorCode.STORE_UNAVAILABLE, "the store path must name a file.")
    _ensure_directory(given.parent, trusted_groups)
    directory = Path(os.path.realpath(given.parent))
    check_directory_chain(directory, trusted_groups)
    database = directory / given.name
    check_store_file(database, "the database file", trusted_groups)
    check_sidecars(database, trusted_groups)
    if not os.path.lexists(database):
        _create_database_file(database)
        check_store_file(database, "the database file", trusted_groups)
    st = os.lstat(database)
    if st.st_nlink > 1:
        raise _unsafe(
            f"the database file {database} has {st.st_nlink} hard links; SQLite cannot "
            "coordinate its locks across several names for one file.",
            UnsafeStoreReason.HARD_LINK,
        )
    return database


def check_sidecars(database: Path, trusted_groups: frozenset[int] = frozenset()) -> None:
    """Check the `-wal`, `-shm` and `-journal` files beside the database, where they exist."""
    for suffix in SIDECAR_SUFFIXES:
        check_store_file(Path(f"{database}{suffix}"), f"the {suffix} sidecar", trusted_groups)


class OpenedFile:
    """The database file a store opened, to tell it is still that file, whole. Open
    connections keep their cached pages and write-ahead log: with the file truncated,
    replaced or removed under the host (a black-box test), searches failed but writes went on
    being acknowledged that no reader and no restart would ever see, and the readiness probe
    said ready. `check` is one `stat`, no SQL: before every write and in `get_source` (the
    probe's read)."""

    def __init__(self, path: Path) -> None:
        self._path = path.absolute()
        found = os.stat(self._path)
        self._identity = (found.st_dev, found.st_ino)

    def check(self) -> None:
        """`STORE_UNAVAILABLE` unless the file is still the one opened, and not empty."""
        try:
            found = os.stat(self._path)
        except OSError:
            found = None
        if found is None or (found.st_dev, found.st_ino) != self._identity or not found.st_size:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "the database file was removed, replaced or truncated while the host ran; "
                "restart the host on an intact file.",
                reason=StoreUnavailableReason.SQLITE_ERROR,
            )

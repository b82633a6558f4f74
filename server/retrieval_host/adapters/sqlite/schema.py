"""Opening a SQLite database of ours: the checks, the pragmas, the schema and its migrations.

Both SQLite stores (vectors and runs) open their files here, through `open_database`, so both
get the same treatment. The file's location passes the checks of `files` (private directory,
no links, one owner) and is opened with `SQLITE_OPEN_NOFOLLOW` through `apsw` (which bundles
SQLite >= 3.51.3; older builds have a WAL-reset bug that can corrupt a database written by
several connections, so they are refused). The connection runs in WAL mode with
`synchronous=FULL`, foreign keys, `secure_delete`, `trusted_schema=OFF` and defensive mode;
every statement is static SQL with bound values.

Identity. The file carries `PRAGMA application_id` and `user_version`. A file with another
application id, or with tables but no id, is *refused with `UNSAFE_STORE`* (reason
`unrelated-database`) and left untouched: it belongs to something else, writing our schema into it
would damage it, and retrying cannot help (so not the transient `STORE_UNAVAILABLE`). A newer
schema version, or an older one no migration reaches, is refused the same way (reason
`schema-version`); an older one with migrations is brought up to date in one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import apsw

from retrieval_host.adapters._store_rules import busy, closed, translating
from retrieval_host.adapters.sqlite.files import check_sidecars, prepare_database_path
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason, UnsafeStoreReason

MIN_SQLITE_VERSION: Final = (3, 51, 3)
BUSY_TIMEOUT_MS: Final = 10_000
WAL_SIZE_LIMIT_BYTES: Final = 64 * 1024 * 1024

_log = logging.getLogger(__name__)


# One step of a migration: a statement, or a function run with the connection inside the
# migration's transaction, for what SQL alone cannot decide (the vector store's media-type
# backfill derives passage ids from their text: `tables._fill_media_types`).
MigrationStep = str | Callable[[apsw.Connection], None]


@dataclass(frozen=True)
class Identity:
    """What makes a database file ours: its application id, schema version and tables.

    `schema` creates the current version in an empty file; `migrations[v]` holds the steps
    (statements or functions) that bring version v to v + 1.
    """

    application_id: int
    version: int
    tables: frozenset[str]
    schema: Sequence[str]
    migrations: Mapping[int, Sequence[MigrationStep]] = field(default_factory=dict)
    name: str = "store"  # what the log calls it ("migrated the run store at ...")


# One lock per database file for the whole process: writers from several store instances on the
# same file queue here instead of spinning in SQLite's busy handler.
_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def path_lock(path: Path) -> threading.Lock:
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(str(path), threading.Lock())


def check_sqlite_version(version: str) -> None:
    """Refuse SQLite builds older than 3.51.3 (WAL-reset corruption with several connections)."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        parts = ()
    if parts < MIN_SQLITE_VERSION:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            f"SQLite {version} is too old; the store needs 3.51.3 or newer (use the apsw wheel "
            "that bundles it).",
            reason=UnsafeStoreReason.SQLITE_VERSION,
        )


def store_error(action: str, exc: apsw.Error) -> RetrievalError:
    # The SQLite message is not rendered to callers (it may name paths or values); it stays
    # attached as the cause for the log.
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return busy(action)
    if isinstance(exc, apsw.ConnectionClosedError):
        return closed()
    if isinstance(exc, apsw.NotADBError):
        return RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the store path holds a file that is not a SQLite database.",
            reason=UnsafeStoreReason.NOT_A_DATABASE,
        )
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"the database failed while {action}.",
        reason=StoreUnavailableReason.SQLITE_ERROR,
    )


def translated(action: str) -> contextlib.AbstractContextManager[None]:
    """Turn apsw errors raised in the block into `RetrievalError`s (ours pass through)."""
    return translating(apsw.Error, store_error, action)


def open_database(
    path: str | os.PathLike[str],
    identity: Identity,
    trusted_groups: frozenset[int] = frozenset(),
    *,
    read_only: bool = False,
    upgrade: bool = True,
    create: bool | None = None,
    earlier: bool = False,
) -> tuple[apsw.Connection, Path]:
    """Check the location, open (creating if missing) and check or create the database.

    Returns the connection and the resolved path that was opened. Raises `UNSAFE_STORE` for an
    unsafe location, an unrelated or newer database, or a SQLite build older than 3.51.3;
    `STORE_UNAVAILABLE` when SQLite cannot open the file. `trusted_groups`: see `files`.
    `read_only`: an existing store of the current schema version, opened without writing
    (no file, table or migration is made; `STORE_UNAVAILABLE` when there is none).
    `upgrade=False`: a store of an earlier schema version is refused (`UNSAFE_STORE`) instead
    of migrated (the operator's commands: a migration is the host's, at its start); so is a
    new file, unless `create` (default: `upgrade`). `earlier` (with `read_only`): a store of an
    earlier schema version is opened too, to be read before a migration.
    """
    check_sqlite_version(apsw.sqlite_lib_version())
    if read_only and not os.path.lexists(path):
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "there is no store at the path to open read-only.",
            reason=StoreUnavailableReason.MISSING_STORE,
        )
    check_not_orphaned(Path(path))  # before the location check creates a file in its place
    database = prepare_database_path(path, trusted_groups)
    name, flags = str(database), apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW
    if read_only:
        name, flags = read_only_target(database, immutable=opens_immutable(database, True))
    with translated("opening the store"):
        conn = apsw.Connection(name, flags=flags)
    try:
        with translated("opening the store"):
            conn.set_busy_timeout(BUSY_TIMEOUT_MS)
            # Before anything writes: a schema in the file must not run our functions.
            conn.execute("PRAGMA trusted_schema=OFF")
            conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
            version = check_identity(conn, identity)
            if read_only:
                if version != identity.version and not earlier:
                    raise RetrievalError(
                        ErrorCode.STORE_READ_ONLY,
                        "a store opened read-only must be of schema version "
                        f"{identity.version} (it is {version}); open it writable once to "
                        "create or migrate it.",
                    )
            else:
                creates = upgrade if create is None else create
                if version is None and not creates:
                    raise _not_migrated(version, identity)
                if version is not None and version != identity.version and not upgrade:
                    raise _not_migrated(version, identity)
                configure(conn)
                if version is None:
                    create_schema(conn, identity)
                else:
                    migrate(conn, identity, database)
        check_sidecars(database, trusted_groups)  # SQLite created them just now: same checks
    except BaseException:
        conn.close()
        raise
    return conn, database


def _not_migrated(version: int | None, identity: Identity) -> RetrievalError:
    found = "holds no schema yet" if version is None else f"has schema version {version}"
    verb = "create" if version is None else "migrate"
    return RetrievalError(
        ErrorCode.UNSAFE_STORE,
        f"the {identity.name} {found}; this release reads version {identity.version} and this "
        f"command does not {verb} it: start the host of this release first (it migrates at "
        "its start), or run the command of the release that serves the store.",
        reason=UnsafeStoreReason.SCHEMA_VERSION,
    )


def check_not_orphaned(database: Path) -> None:
    """`STORE_UNAVAILABLE` (`missing-store`) when the database file is missing but its
    write-ahead log is there: the file was removed (while a host ran, in a black-box test),
    and creating an empty store in its place would serve nothing, ready, as if all were
    well. The message names the file: a host has two (the store and its run records), and
    an operator told only "the database file" looked at the one still there."""
    wal = database.with_name(database.name + "-wal")
    if not os.path.lexists(database) and os.path.lexists(wal):
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the database file {os.path.abspath(database)} is missing but its write-ahead "
            f"log is there (was it removed?): restore the file, or remove {wal.name} and "
            f"{database.name}-shm to start an empty store.",
            reason=StoreUnavailableReason.MISSING_STORE,
        )


def opens_immutable(database: Path, read_only: bool) -> bool:
    """Whether a store opened read-only is opened as an immutable file: when its folder
    cannot be written (a read-only volume, a snapshot mount), SQLite cannot make the
    shared-memory file a WAL database needs, and refused to open it at all. An immutable file
    is read without locks or its log, so a store with a `-wal` or `-shm` beside it (a host
    still writing, or one that did not stop cleanly) is refused rather than read stale."""
    if not read_only or os.access(database.parent, os.W_OK):
        return False
    # A host that stopped removed both; either one left means a host may still be writing
    # (a live store mounted read-only) or stopped mid-way: commits may be in the log.
    for sidecar in ("-wal", "-shm"):
        if os.path.lexists(database.with_name(database.name + sidecar)):
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"the read-only store on a volume that cannot be written has a {sidecar} file "
                "beside it: a host may still be writing it, or stopped without folding its "
                "log in. Copy the store after its host stopped (or open it writable once).",
                reason=StoreUnavailableReason.SQLITE_ERROR,
            )
    return True


def read_only_target(database: Path, *, immutable: bool) -> tuple[str, int]:
    """The name and flags SQLite opens a read-only connection to `database` with."""
    flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW
    if not immutable:
        return str(database), flags
    return f"file:{quote(str(database))}?immutable=1", flags | apsw.SQLITE_OPEN_URI


def one(cursor: apsw.Cursor) -> tuple[Any, ...]:
    row = cursor.fetchone()
    if row is None:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the database returned no row.",
            reason=StoreUnavailableReason.SQLITE_ERROR,
        )
    return tuple(row)


@contextlib.contextmanager
def transaction(conn: apsw.Connection, begin: str) -> Iterator[None]:
    """Run the block in one transaction: COMMIT at the end, ROLLBACK on any exception."""
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def immediate(conn: apsw.Connection) -> contextlib.AbstractContextManager[None]:
    # IMMEDIATE takes the write lock up front: a read-then-write transaction can never find
    # its snapshot stale at the first write (SQLITE_BUSY_SNAPSHOT, which skips the busy wait).
    return transaction(conn, "BEGIN IMMEDIATE")


def rollback(conn: apsw.Connection) -> None:
    # SQLite may already have rolled back (e.g. on a full disk); ROLLBACK would then fail.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def truncate_wal(conn: apsw.Connection) -> None:
    """Fold the WAL into the database and truncate it, so deleted rows' old frames go too.

    secure_delete has zeroed the freed pages in the database, but the WAL still holds earlier
    frames with the deleted content. Best effort, never an error (the delete is committed): a
    reader in another process can keep the WAL in use, and then the next checkpoint overwrites
    those frames. A short busy timeout keeps a delete from waiting on such a reader for long.
    """
    conn.set_busy_timeout(250)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except apsw.Error:
        _log.info("WAL checkpoint after a delete was deferred")
    finally:
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)


def _identity_snapshot(conn: apsw.Connection) -> tuple[int, int, set[str]]:
    """The application id, user version and table names, read in one transaction.

    Read as three autocommit statements, another process creating the schema between them
    (two workers opening a new store at once) showed a file with tables but no application
    id: refused as another application's database."""
    if conn.in_transaction:
        return _read_identity(conn)
    with transaction(conn, "BEGIN DEFERRED"):
        return _read_identity(conn)


def _read_identity(conn: apsw.Connection) -> tuple[int, int, set[str]]:
    application_id = int(one(conn.execute("PRAGMA application_id"))[0])
    user_version = int(one(conn.execute("PRAGMA user_version"))[0])
    names = {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        )
    }
    return application_id, user_version, names


def check_identity(conn: apsw.Connection, identity: Identity) -> int | None:
    """The file's schema version, None for an empty database; raises for anything that is not
    ours or that this host cannot read. Reads only."""
    application_id, user_version, names = _identity_snapshot(conn)
    if application_id == 0 and user_version == 0 and not names:
        return None
    if application_id != identity.application_id:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the file at the store path is a SQLite database of another application (other "
            "tables or another application id); point the store at its own private file.",
            reason=UnsafeStoreReason.UNRELATED_DATABASE,
        )
    reachable = all(v in identity.migrations for v in range(user_version, identity.version))
    if user_version > identity.version or not reachable:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            f"the store has schema version {user_version}; this host reads version "
            f"{identity.version}.",
            reason=UnsafeStoreReason.SCHEMA_VERSION,
        )
    if not names >= identity.tables:
        raise RetrievalError(
            ErrorCode.UNSAFE_STORE,
            "the store's schema is incomplete; it was not written by this host.",
            reason=UnsafeStoreReason.UNRELATED_DATABASE,
        )
    return user_version


def configure(conn: apsw.Connection) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the store could not switch to WAL mode.",
            reason=StoreUnavailableReason.JOURNAL_MODE,
        )
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA secure_delete=ON")
    # After a checkpoint, a WAL grown by a burst of writes is cut back to this size.
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    checks = {
        "synchronous": 2,
        "foreign_keys": 1,
        "secure_delete": 1,
    }
    for pragma, wanted in checks.items():
        value = conn.execute(f"PRAGMA {pragma}").fetchone()  # static names from the dict above
        if value is None or int(value[0]) != wanted:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"the store could not set PRAGMA {pragma}.",
                reason=StoreUnavailableReason.PRAGMA,
            )


def create_schema(conn: apsw.Connection, identity: Identity) -> None:
    with immediate(conn):
        # Another process may have created it between our check and the write lock.
        if check_identity(conn, identity) is not None:
            return
        for statement in identity.schema:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id={identity.application_id}")  # constants, not input
        conn.execute(f"PRAGMA user_version={identity.version}")


def migrate(conn: apsw.Connection, identity: Identity, database: Path | None = None) -> None:
    """Bring a database of an earlier release to the current version, in one transaction, and
    say so in the log (an operator going back needs the backup from then on)."""
    with immediate(conn):
        # Checked again under the write lock: another process may have migrated it already.
        version = check_identity(conn, identity)
        if version is None or version == identity.version:
            return
        for step in range(version, identity.version):
            for statement in identity.migrations[step]:
                if isinstance(statement, str):
                    conn.execute(statement)
                else:
                    statement(conn)
        conn.execute(f"PRAGMA user_version={identity.version}")  # a constant, not input
    _log.info(
        "migrated the %s at %s from schema version %d to %d (an earlier release can no "
        "longer open it)",
        identity.name,
        database if database is not None else "?",
        version,
        identity.version,
    )

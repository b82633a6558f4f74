"""Durable run records and idempotency keys in SQLite (apsw, bundled SQLite >= 3.51.3).

The file is opened by `schema.open_database` with the same checks as the vector store's: a
private location, our application id (another database is refused with `UNSAFE_STORE`), and
a schema version this host reads, migrating an earlier release's file in place.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import apsw

from retrieval_host.adapters._store_rules import (
    RUN_COLUMNS,
    RUN_INSERT_COLUMNS,
    RUN_STATUSES,
    USAGE_COLUMNS,
    run_insert_values,
    run_record,
    run_result_json,
    usage_record,
    usage_values,
)
from retrieval_host.adapters.run_leases import (
    DEFAULT_LEASE_S,
    INTERRUPTED,
    UNFINISHED_RUN,
    LeaseKeeper,
)
from retrieval_host.adapters.sqlite.files import OpenedFile
from retrieval_host.adapters.sqlite.schema import Identity, open_database, translated
from retrieval_host.adapters.usage_writer import UsageWriter
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.core.runs_model import RunResult
from retrieval_host.core.usage import UsageRecord

__all__ = ["SqliteRunStore"]

APPLICATION_ID: Final = 0x52484E52  # "RHNR": retrieval-host run records
SCHEMA_VERSION: Final = 4
_USAGE_TABLE: Final = """CREATE TABLE usage (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    subject TEXT NOT NULL,
    operation TEXT NOT NULL,
    kind TEXT NOT NULL,
    provider TEXT NOT NULL,
    account TEXT,
    model TEXT NOT NULL,
    corpus TEXT,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    documents INTEGER NOT NULL,
    run_id TEXT
)"""
_USAGE_INDEX: Final = "CREATE INDEX usage_at ON usage (at)"
_SCHEMA: Final = (
    f"""CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ({RUN_STATUSES})),
    created_at TEXT NOT NULL,
    result_json TEXT,
    error_code TEXT,
    provider TEXT,
    corpus TEXT,
    lease_until REAL,
    UNIQUE (subject, idempotency_key)
)""",
    _USAGE_TABLE,
    _USAGE_INDEX,
)
# Version 1 had no provider and corpus columns; opening it adds them (NULL for older runs).
# Version 2 had no usage table; opening it adds an empty one.
# Version 3 had no leases (`adapters.run_leases`): its running records keep none.
_MIGRATIONS: Final = {
    1: ("ALTER TABLE runs ADD COLUMN provider TEXT", "ALTER TABLE runs ADD COLUMN corpus TEXT"),
    2: (_USAGE_TABLE, _USAGE_INDEX),
    3: ("ALTER TABLE runs ADD COLUMN lease_until REAL",),
}
# `tables`: those every version has (`usage` came with version 3).
IDENTITY: Final = Identity(
    APPLICATION_ID, SCHEMA_VERSION, frozenset({"runs"}), _SCHEMA, _MIGRATIONS, "run store"
)
# A record, and whether it is running on a lease that lapsed before `?`.
_SELECT_LAPSED: Final = (
    f"SELECT {RUN_COLUMNS}, status = 'running' AND lease_until < ?"  # noqa: S608 - constants
    " FROM runs"
)
# Marks running records interrupted; the caller adds which (` AND ...`).
_INTERRUPT: Final = (
    f"UPDATE runs SET status = 'failed', error_code = '{INTERRUPTED}'"  # noqa: S608 - constant
    " WHERE status = 'running'"
)


class SqliteRunStore:
    """Implements `core.run_ports.RunStore`. One connection, serialized by a lock.

    Every write and read first checks that the file is still the one opened, whole
    (`files.OpenedFile`, one `stat`): with `runs.db` removed under a serving host (a black-box
    test), runs completed and usage was acknowledged into the unlinked file, `/readyz` said
    ready, and the restart found none of it. They answer `STORE_UNAVAILABLE` instead.
    """

    def __init__(
        self, connection: apsw.Connection, path: Path, *, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        """Private: use `SqliteRunStore.open(path)`, which checks and prepares the file."""
        self._db = connection
        self._file = OpenedFile(path)
        self._lock = threading.Lock()
        # Usage records are committed in groups by one thread (`adapters.usage_writer`).
        self._usage = UsageWriter(self._write_usage, name="usage-writer-sqlite")
        # Running runs' leases, renewed by one thread (`adapters.run_leases`).
        self._leases = LeaseKeeper(
            self._renew, self._interrupt, lease_s=lease_s, name="run-leases-sqlite"
        )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        trusted_groups: frozenset[int] = frozenset(),
        lease_s: float = DEFAULT_LEASE_S,
        migrate: bool = True,
        create: bool | None = None,
    ) -> SqliteRunStore:
        """Open (creating if missing) the run database at `path` (`trusted_groups` as for
        `SqliteVectorStore.open`; `lease_s`: how long a running record stays so without its
        host renewing it, `adapters.run_leases`; `migrate=False`: a database of an earlier
        schema version is refused, not migrated, and so is a new one unless `create`, as by
        the operator's commands).

        Raises `UNSAFE_STORE` for an unsafe location, an unrelated or newer database, or a
        SQLite build older than 3.51.3; `STORE_UNAVAILABLE` when SQLite cannot open the file.
        """
        connection, database = open_database(
            path, IDENTITY, trusted_groups, upgrade=migrate, create=create
        )
        try:
            return cls(connection, database, lease_s=lease_s)
        except BaseException:
            connection.close()
            raise

    def begin(self, record: RunRecord) -> RunRecord | None:
        with self._lock, translated("recording a run"):
            self._file.check()
            with self._db:
                self._db.execute(
                    f"INSERT INTO runs ({RUN_INSERT_COLUMNS})"  # noqa: S608 - constant columns
                    " VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)"
                    " ON CONFLICT (subject, idempotency_key) DO NOTHING",
                    (*run_insert_values(record), time.time() + self._leases.lease_s),
                )
                inserted = self._db.changes() == 1
            if inserted:
                self._leases.add(record.run_id)
                return None
            return self._read(
                " WHERE subject = ? AND idempotency_key = ?",
                (record.subject, record.idempotency_key),
            )

    def complete(self, run_id: str, result: RunResult) -> None:
        self._leases.discard(run_id)
        with self._lock, translated("recording a run"), self._db:
            self._file.check()
            self._db.execute(
                "UPDATE runs SET status = 'completed', result_json = ?, error_code = NULL"
                " WHERE run_id = ?",
                (run_result_json(result), run_id),
            )

    def finish(self, run_id: str, status: RunStatus, error_code: str) -> None:
        self._leases.discard(run_id)
        with self._lock, translated("finishing a run"), self._db:
            self._file.check()
            self._db.execute(
                "UPDATE runs SET status = ?, error_code = ?"  # noqa: S608 - constants
                f" WHERE run_id = ? AND {UNFINISHED_RUN}",
                (status, error_code, run_id),
            )

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock, translated("reading a run"):
            self._file.check()  # not an answer from the connection's cache of a lost file
            return self._read(" WHERE run_id = ?", (run_id,))

    def _read(self, where: str, params: tuple[str | None, ...]) -> RunRecord | None:
        """The one record `where` selects, a running one whose lease lapsed marked
        interrupted first. Called with the lock held."""
        now = time.time()
        rows = self._db.execute(_SELECT_LAPSED + where, (now, *params)).fetchall()
        if rows and rows[0][-1]:
            with self._db:
                self._db.execute(
                    _INTERRUPT + " AND run_id = ? AND lease_until < ?", (rows[0][0], now)
                )
            rows = self._db.execute(_SELECT_LAPSED + where, (now, *params)).fetchall()
        return run_record(rows[0][:-1]) if rows else None

    def _renew(self, run_ids: Sequence[str], lease_s: float) -> None:
        marks = ", ".join("?" * len(run_ids))
        with self._lock, translated("renewing run leases"), self._db:
            self._file.check()
            self._db.execute(
                f"UPDATE runs SET lease_until = ?"  # noqa: S608 - placeholders only
                f" WHERE status = 'running' AND run_id IN ({marks})",
                (time.time() + lease_s, *run_ids),
            )

    def _interrupt(self, run_ids: Sequence[str]) -> None:
        marks = ", ".join("?" * len(run_ids))
        with self._lock, translated("marking runs interrupted"), self._db:
            self._file.check()
            self._db.execute(_INTERRUPT + f" AND run_id IN ({marks})", tuple(run_ids))

    def record_usage(self, records: Sequence[UsageRecord]) -> None:
        """`core.usage.UsageSink`: queue the records for the next group commit (within one
        commit of now); never raises (`adapters.usage_writer`)."""
        self._usage.add(records)

    def _write_usage(self, records: Sequence[UsageRecord]) -> None:
        """One group of records in one transaction (`UsageWriter`'s `write`): `RetrievalError`
        when the store cannot be written (a file removed or replaced under the host included:
        they would be lost with it), the binding's error (`OverflowError` for an integer
        beyond 64 bits) when a record's values are refused."""
        with self._lock, translated("recording usage"), self._db:
            self._file.check()
            self._db.executemany(
                f"INSERT INTO usage ({USAGE_COLUMNS})"  # noqa: S608 - constant columns
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [usage_values(r) for r in records],
            )

    def read_usage(
        self, *, since: str | None = None, subject: str | None = None, limit: int = 10_000
    ) -> list[UsageRecord]:
        """`core.usage.UsageLog`: records at or after `since`, of `subject`, oldest first
        (after this process's own records queued before the call are written)."""
        self._usage.flush()
        with self._lock, translated("reading usage"):
            self._file.check()
            rows = self._db.execute(
                f"SELECT {USAGE_COLUMNS} FROM usage"  # noqa: S608 - constant columns
                " WHERE at >= ? AND (? IS NULL OR subject = ?) ORDER BY at, id LIMIT ?",
                (since or "", subject, subject, limit),
            ).fetchall()
        return [usage_record(row) for row in rows]

    def prune(self, before: str, *, usage: bool = False, vacuum: bool = False) -> tuple[int, int]:
        """Delete the finished runs created before `before` (an instant as records write it,
        `2026-12-01T00:00:00.000Z`): their answers, evidence manifests and idempotency keys
        (a key used again starts a new run). A running record is kept unless its host stopped
        renewing its lease. With `usage`, also the usage records before it. Returns (runs,
        usage records) deleted. The deleted rows' bytes are overwritten (`secure_delete`) and
        the write-ahead log checkpointed, so the text does not stay in free pages; the file
        keeps its size unless `vacuum`: then the file is rewritten without its free pages
        (SQLite's VACUUM: it holds the write lock throughout, ~20 s a GB, so a serving host's
        run writes wait and past their busy timeout fail) and the log checkpointed again,
        which gives the space back (probe "soak", session 44: 11.8 MB of runs.db held 0.3 MB
        of records)."""
        self._usage.flush()
        with self._lock, translated("pruning runs"):
            self._file.check()
            self._db.execute("PRAGMA secure_delete = ON")
            try:
                with self._db:
                    self._db.execute(
                        "DELETE FROM runs WHERE created_at < ? AND (status != 'running'"
                        " OR lease_until IS NULL OR lease_until < ?)",
                        (before, time.time()),
                    )
                    runs = self._db.changes()
                    used = 0
                    if usage:
                        self._db.execute("DELETE FROM usage WHERE at < ?", (before,))
                        used = self._db.changes()
            finally:
                self._db.execute("PRAGMA secure_delete = OFF")
            # Best effort: a host reading meanwhile keeps the log's older frames until it ends.
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            if vacuum:
                # The rewrite goes through the log; the checkpoint moves it into the file and
                # truncates both (the file shrinks only then). It waits for a serving host's
                # readers up to the busy timeout; past it the host's own checkpoints finish
                # the job, and the command says so (review V, session 44: it reported the old
                # size as the new one, beside a 728 MB log).
                self._db.execute("VACUUM")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return runs, used

    def check_readable(self) -> None:
        """The readiness probe's read (`Driver.stores_answer`): `STORE_UNAVAILABLE` when the
        file is not the one opened, whole, or SQLite cannot read its runs."""
        with self._lock, translated("probing the run records"):
            self._file.check()
            self._db.execute("SELECT run_id FROM runs LIMIT 1").fetchall()

    def close(self) -> None:
        self._leases.close()  # marks the runs still going interrupted
        self._usage.close()  # writes what is queued first
        with self._lock:
            self._db.close()

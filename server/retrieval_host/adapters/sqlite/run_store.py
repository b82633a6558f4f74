"""Durable run records and idempotency keys in SQLite (apsw, bundled SQLite >= 3.51.3).

The file is opened by `schema.open_database` with the same checks as the vector store's: a
private location, our application id (another database is refused with `UNSAFE_STORE`), and
a schema version this host reads, migrating an earlier release's file in place.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
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
    usage_not_recorded,
    usage_record,
    usage_values,
)
from retrieval_host.adapters.sqlite.schema import Identity, open_database, translated
from retrieval_host.adapters.usage_writer import UsageWriter
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.core.runs_model import RunResult
from retrieval_host.core.usage import UsageRecord

__all__ = ["SqliteRunStore"]

APPLICATION_ID: Final = 0x52484E52  # "RHNR": retrieval-host run records
SCHEMA_VERSION: Final = 3
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
    UNIQUE (subject, idempotency_key)
)""",
    _USAGE_TABLE,
    _USAGE_INDEX,
)
# Version 1 had no provider and corpus columns; opening it adds them (NULL for older runs).
# Version 2 had no usage table; opening it adds an empty one.
_MIGRATIONS: Final = {
    1: ("ALTER TABLE runs ADD COLUMN provider TEXT", "ALTER TABLE runs ADD COLUMN corpus TEXT"),
    2: (_USAGE_TABLE, _USAGE_INDEX),
}
# `tables`: those every version has (`usage` came with version 3).
IDENTITY: Final = Identity(
    APPLICATION_ID, SCHEMA_VERSION, frozenset({"runs"}), _SCHEMA, _MIGRATIONS
)
_SELECT: Final = f"SELECT {RUN_COLUMNS} FROM runs"  # noqa: S608 - constant column names


class SqliteRunStore:
    """Implements `core.run_ports.RunStore`. One connection, serialized by a lock."""

    def __init__(self, connection: apsw.Connection) -> None:
        """Private: use `SqliteRunStore.open(path)`, which checks and prepares the file."""
        self._db = connection
        self._lock = threading.Lock()
        # Usage records are committed in groups by one thread (`adapters.usage_writer`).
        self._usage = UsageWriter(self._write_usage, name="usage-writer-sqlite")

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, trusted_groups: frozenset[int] = frozenset()
    ) -> SqliteRunStore:
        """Open (creating if missing) the run database at `path` (`trusted_groups` as for
        `SqliteVectorStore.open`).

        Raises `UNSAFE_STORE` for an unsafe location, an unrelated or newer database, or a
        SQLite build older than 3.51.3; `STORE_UNAVAILABLE` when SQLite cannot open the file.
        """
        connection, _ = open_database(path, IDENTITY, trusted_groups)
        return cls(connection)

    def begin(self, record: RunRecord) -> RunRecord | None:
        with self._lock, translated("recording a run"), self._db:
            self._db.execute(
                f"INSERT INTO runs ({RUN_INSERT_COLUMNS})"  # noqa: S608 - constant columns
                " VALUES (?, ?, ?, ?, 'running', ?, ?, ?)"
                " ON CONFLICT (subject, idempotency_key) DO NOTHING",
                run_insert_values(record),
            )
            if self._db.changes() == 1:
                return None
            rows = self._db.execute(
                _SELECT + " WHERE subject = ? AND idempotency_key = ?",
                (record.subject, record.idempotency_key),
            ).fetchall()
        return run_record(rows[0])

    def complete(self, run_id: str, result: RunResult) -> None:
        with self._lock, translated("recording a run"), self._db:
            self._db.execute(
                "UPDATE runs SET status = 'completed', result_json = ? WHERE run_id = ?",
                (run_result_json(result), run_id),
            )

    def finish(self, run_id: str, status: RunStatus, error_code: str) -> None:
        with self._lock, translated("finishing a run"), self._db:
            self._db.execute(
                "UPDATE runs SET status = ?, error_code = ?"
                " WHERE run_id = ? AND status = 'running'",
                (status, error_code, run_id),
            )

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock, translated("reading a run"):
            rows = self._db.execute(_SELECT + " WHERE run_id = ?", (run_id,)).fetchall()
        return run_record(rows[0]) if rows else None

    def record_usage(self, records: Sequence[UsageRecord]) -> None:
        """`core.usage.UsageSink`: queue the records for the next group commit (within one
        commit of now); never raises (`adapters.usage_writer`)."""
        self._usage.add(records)

    def _write_usage(self, records: Sequence[UsageRecord]) -> None:
        """One group of records in one transaction; logs and drops them on failure."""
        try:
            with self._lock, self._db:
                self._db.executemany(
                    f"INSERT INTO usage ({USAGE_COLUMNS})"  # noqa: S608 - constant columns
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [usage_values(r) for r in records],
                )
        except Exception as error:  # metering never fails the operation that succeeded
            usage_not_recorded(records, error)

    def read_usage(
        self, *, since: str | None = None, subject: str | None = None, limit: int = 10_000
    ) -> list[UsageRecord]:
        """`core.usage.UsageLog`: records at or after `since`, of `subject`, oldest first
        (after this process's own records queued before the call are written)."""
        self._usage.flush()
        with self._lock, translated("reading usage"):
            rows = self._db.execute(
                f"SELECT {USAGE_COLUMNS} FROM usage"  # noqa: S608 - constant columns
                " WHERE at >= ? AND (? IS NULL OR subject = ?) ORDER BY at, id LIMIT ?",
                (since or "", subject, subject, limit),
            ).fetchall()
        return [usage_record(row) for row in rows]

    def close(self) -> None:
        self._usage.close()  # writes what is queued first
        with self._lock:
            self._db.close()

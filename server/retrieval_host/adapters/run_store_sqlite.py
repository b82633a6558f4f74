"""Durable run records and idempotency keys in SQLite (apsw, bundled SQLite >= 3.51.3)."""

from __future__ import annotations

import os
import threading

import apsw

from retrieval_host.adapters._fs_safety import prepare_database_path
from retrieval_host.adapters._rows import RUN_COLUMNS, run_record
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.core.runs_model import RunResult
from retrieval_host.wire.run_storage import encode_result

_APPLICATION_ID = 0x52484E52  # "RHNR": refuse a database that is not ours
_SCHEMA_VERSION = 2
# Version 1 had no provider and corpus columns; opening it adds them (NULL for older runs).
_MIGRATIONS = {
    1: ("ALTER TABLE runs ADD COLUMN provider TEXT", "ALTER TABLE runs ADD COLUMN corpus TEXT")
}
_SELECT = f"SELECT {RUN_COLUMNS} FROM runs"  # noqa: S608 - constant column names
_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    created_at TEXT NOT NULL,
    result_json TEXT,
    error_code TEXT,
    provider TEXT,
    corpus TEXT,
    UNIQUE (subject, idempotency_key)
);
"""


class SqliteRunStore:
    """Implements `core.run_ports.RunStore`. One connection, serialized by a lock."""

    def __init__(self, connection: apsw.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> SqliteRunStore:
        target = prepare_database_path(path)
        db = apsw.Connection(str(target))
        db.set_busy_timeout(5000)
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=FULL",
            "PRAGMA foreign_keys=ON",
            "PRAGMA secure_delete=ON",
        ):
            db.execute(pragma).fetchall()
        app_id = db.execute("PRAGMA application_id").fetchall()[0][0]
        tables = db.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]
        if app_id == 0 and tables == 0:
            with db:
                db.execute(_SCHEMA)
                db.execute(f"PRAGMA application_id={_APPLICATION_ID}")
                db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        elif app_id != _APPLICATION_ID:
            db.close()
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"{target.name} is not a retrieval-host run database; refusing to use it.",
            )
        else:
            _migrate(db, target.name)
        return cls(db)

    def begin(self, record: RunRecord) -> RunRecord | None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO runs (run_id, subject, idempotency_key, fingerprint, status,"
                " created_at, provider, corpus) VALUES (?, ?, ?, ?, 'running', ?, ?, ?)"
                " ON CONFLICT (subject, idempotency_key) DO NOTHING",
                (
                    record.run_id,
                    record.subject,
                    record.idempotency_key,
                    record.request_fingerprint,
                    record.created_at,
                    record.provider,
                    record.corpus,
                ),
            )
            if self._db.changes() == 1:
                return None
            rows = self._db.execute(
                _SELECT + " WHERE subject = ? AND idempotency_key = ?",
                (record.subject, record.idempotency_key),
            ).fetchall()
        return run_record(rows[0])

    def complete(self, run_id: str, result: RunResult) -> None:
        body = encode_result(result)
        with self._lock, self._db:
            self._db.execute(
                "UPDATE runs SET status = 'completed', result_json = ? WHERE run_id = ?",
                (body, run_id),
            )

    def finish(self, run_id: str, status: RunStatus, error_code: str) -> None:
        with self._lock, self._db:
            self._db.execute(
                "UPDATE runs SET status = ?, error_code = ?"
                " WHERE run_id = ? AND status = 'running'",
                (status, error_code, run_id),
            )

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            rows = self._db.execute(_SELECT + " WHERE run_id = ?", (run_id,)).fetchall()
        return run_record(rows[0]) if rows else None

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _migrate(db: apsw.Connection, name: str) -> None:
    """Bring a run database of an earlier release to `_SCHEMA_VERSION`, in one transaction."""
    with db:
        version = int(str(db.execute("PRAGMA user_version").fetchall()[0][0]))
        if version > _SCHEMA_VERSION:
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                f"{name} has run schema version {version}; this host reads up to "
                f"{_SCHEMA_VERSION}.",
            )
        for step in range(version, _SCHEMA_VERSION):
            for statement in _MIGRATIONS[step]:
                db.execute(statement)
        db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

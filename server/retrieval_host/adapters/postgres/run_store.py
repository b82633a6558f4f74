"""Durable run records and idempotency keys in PostgreSQL, shared by every host replica.

Same semantics as `sqlite.run_store.SqliteRunStore`: `begin` inserts a `running` record, or,
when the subject already used the idempotency key, inserts nothing and returns the existing
record, so a replay works whichever replica receives it. Two replicas beginning the same key at
once are settled by the unique constraint: `INSERT ... ON CONFLICT DO NOTHING` waits for the
other insert to commit, then the reading statement sees it. Results are stored in the
versioned format of `wire.run_storage`.

The table lives in the same schema as the vector store (default `retrieval_host`) under its own
`schema_version` component (`run-store`); a schema that is not ours is refused with
`UNSAFE_STORE` as for the vector store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import psycopg
from psycopg import sql

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
from retrieval_host.adapters.postgres.pool import (
    Connection,
    ConnectionPool,
    answer_timeout_s,
    store_error,
    translated,
)
from retrieval_host.adapters.postgres.schema import (
    DEFAULT_SCHEMA,
    check_schema_name,
    ensure_schema_component,
    schema_sql,
)
from retrieval_host.adapters.run_leases import (
    DEFAULT_LEASE_S,
    INTERRUPTED,
    UNFINISHED_RUN,
    LeaseKeeper,
)
from retrieval_host.adapters.usage_writer import UsageWriter
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason, StoreUnavailableReason
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.core.runs_model import RunResult
from retrieval_host.core.usage import UsageRecord

__all__ = ["PgRunStore"]

COMPONENT: Final = "run-store"
SCHEMA_VERSION: Final = 4

_TABLES: Final = {
    "runs": {
        "run_id": "text",
        "subject": "text",
        "idempotency_key": "text",
        "fingerprint": "text",
        "status": "text",
        "created_at": "text",
        "result_json": "text",
        "error_code": "text",
        "provider": "text",
        "corpus": "text",
        "lease_until": "float8",
    },
    "usage": {
        "id": "int8",
        "at": "text",
        "subject": "text",
        "operation": "text",
        "kind": "text",
        "provider": "text",
        "account": "text",
        "model": "text",
        "corpus": "text",
        "requests": "int8",
        "input_tokens": "int8",
        "output_tokens": "int8",
        "documents": "int8",
        "run_id": "text",
    },
}
_USAGE_DDL: Final = (
    """CREATE TABLE {s}.usage (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at text NOT NULL,
        subject text NOT NULL,
        operation text NOT NULL,
        kind text NOT NULL,
        provider text NOT NULL,
        account text,
        model text NOT NULL,
        corpus text,
        requests bigint NOT NULL,
        input_tokens bigint NOT NULL,
        output_tokens bigint NOT NULL,
        documents bigint NOT NULL,
        run_id text
    )""",
    "CREATE INDEX usage_at ON {s}.usage (at)",
)
_DDL: Final = (
    f"""CREATE TABLE {{s}}.runs (
        run_id text PRIMARY KEY,
        subject text NOT NULL,
        idempotency_key text,
        fingerprint text NOT NULL,
        status text NOT NULL CHECK (status IN ({RUN_STATUSES})),
        created_at text NOT NULL,
        result_json text,
        error_code text,
        provider text,
        corpus text,
        lease_until double precision,
        CONSTRAINT runs_idempotency_key UNIQUE (subject, idempotency_key)
    )""",
    *_USAGE_DDL,
)
# Leases are on the database server's clock, which every replica shares (`adapters.run_leases`).
_NOW: Final = "extract(epoch FROM clock_timestamp())"
# The record, and whether it is running on a lease that lapsed.
_SELECT_LAPSED: Final = (
    f"SELECT {RUN_COLUMNS}, status = 'running' AND lease_until < {_NOW} "  # noqa: S608
    "FROM {s}.runs"
)
_INTERRUPT: Final = (
    f"UPDATE {{s}}.runs SET status = 'failed', error_code = '{INTERRUPTED}' "  # noqa: S608
    "WHERE status = 'running' AND run_id = ANY(%s)"
)
# Finished runs, and running ones whose host stopped renewing them (no lease: before leases).
_PRUNE_RUNS: Final = (
    "DELETE FROM {s}.runs WHERE created_at < %s AND (status <> 'running' "  # noqa: S608
    f"OR lease_until IS NULL OR lease_until < {_NOW})"
)
# Version 1 had no provider and corpus columns (NULL for the runs it recorded).
_MIGRATIONS: Final = {
    1: (
        "ALTER TABLE {s}.runs ADD COLUMN provider text",
        "ALTER TABLE {s}.runs ADD COLUMN corpus text",
    ),
    # Version 2 had no usage table.
    2: _USAGE_DDL,
    # Version 3 had no leases (`adapters.run_leases`): its running records keep none.
    3: ("ALTER TABLE {s}.runs ADD COLUMN lease_until double precision",),
}


class PgRunStore:
    """Implements `core.run_ports.RunStore` over PostgreSQL; create with `open()`."""

    def __init__(
        self, pool: ConnectionPool, schema: str, *, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        """Private: use `PgRunStore.open(dsn)`, which prepares the schema."""
        self._pool = pool
        self._schema = schema
        # Usage records are committed in groups by one thread (`adapters.usage_writer`).
        self._usage = UsageWriter(self._write_usage, name="usage-writer-postgres")
        # Running runs' leases, renewed by one thread (`adapters.run_leases`).
        self._leases = LeaseKeeper(
            self._renew, self._interrupt, lease_s=lease_s, name="run-leases-postgres"
        )

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = 2,
        statement_timeout_ms: int = 30_000,
        lease_s: float = DEFAULT_LEASE_S,
        migrate: bool = True,
        create: bool | None = None,
    ) -> PgRunStore:
        """Connect and create (or check) the run table. `UNSAFE_STORE` for a foreign schema.
        `lease_s`: how long a running record stays so without its host renewing it
        (`adapters.run_leases`). `migrate=False`: tables of an earlier version are refused
        rather than migrated, and none are created unless `create` (the operator's commands)."""
        check_schema_name(schema)
        if isinstance(statement_timeout_ms, bool) or statement_timeout_ms < 1:
            raise ValueError("statement_timeout_ms must be a positive integer")

        def setup(conn: Connection) -> None:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false)",
                (str(statement_timeout_ms), str(statement_timeout_ms)),
            )

        pool = ConnectionPool(
            dsn, pool_size, setup, answer_timeout_s=answer_timeout_s(statement_timeout_ms)
        )
        try:
            with pool.connection() as conn:
                ensure_schema_component(
                    conn,
                    schema,
                    COMPONENT,
                    SCHEMA_VERSION,
                    _TABLES,
                    _DDL,
                    _MIGRATIONS,
                    migrate=migrate,
                    create=create,
                )
        except BaseException:
            pool.close()
            raise
        return cls(pool, schema, lease_s=lease_s)

    def begin(self, record: RunRecord) -> RunRecord | None:
        """Insert a `running` record, or return the subject's record for the same key."""
        _reject_nul(
            record.run_id, record.subject, record.idempotency_key, record.provider, record.corpus
        )
        with (
            self._pool.connection() as conn,
            translated("recording a run"),
            conn.transaction(),
        ):
            inserted = conn.execute(
                self._sql(
                    f"INSERT INTO {{s}}.runs ({RUN_INSERT_COLUMNS}) "  # noqa: S608 - constants
                    f"VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, {_NOW} + %s) "
                    "ON CONFLICT (subject, idempotency_key) DO NOTHING RETURNING run_id"
                ),
                (*run_insert_values(record), self._leases.lease_s),
            ).fetchone()
            if inserted is not None:
                self._leases.add(record.run_id)
                return None
            existing = self._read(
                conn, " WHERE subject = %s AND idempotency_key = %s",
                (record.subject, record.idempotency_key),
            )  # fmt: skip
        if existing is None:  # pragma: no cover - a conflicting row cannot vanish (READ COMMITTED)
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "the run record of this idempotency key disappeared.",
                reason=StoreUnavailableReason.DATABASE_ERROR,
            )
        return existing

    def complete(self, run_id: str, result: RunResult) -> None:
        """Mark the run completed with its result (in the `wire.run_storage` format)."""
        self._leases.discard(run_id)
        body = run_result_json(result)
        with self._pool.connection() as conn, translated("completing a run"):
            conn.execute(
                self._sql(
                    "UPDATE {s}.runs SET status = 'completed', result_json = %s, error_code = NULL "
                    "WHERE run_id = %s"
                ),
                (body, run_id),
            )

    def finish(self, run_id: str, status: RunStatus, error_code: str) -> None:
        """End a still-running run with a failure or cancellation status."""
        self._leases.discard(run_id)
        with self._pool.connection() as conn, translated("finishing a run"):
            conn.execute(
                self._sql(
                    "UPDATE {s}.runs SET status = %s, error_code = %s "  # noqa: S608
                    f"WHERE run_id = %s AND {UNFINISHED_RUN}"
                ),
                (status, error_code, run_id),
            )

    def get(self, run_id: str) -> RunRecord | None:
        """The record of a run, or None."""
        if "\x00" in run_id:
            return None
        with self._pool.connection() as conn, translated("reading a run"):
            return self._read(conn, " WHERE run_id = %s", (run_id,))

    def _read(
        self, conn: Connection, where: str, params: tuple[str | None, ...]
    ) -> RunRecord | None:
        """The one record `where` selects, a running one whose lease lapsed marked
        interrupted first (the marking guarded by the lapse: a renewal between the two
        statements wins)."""
        row = conn.execute(self._sql(_SELECT_LAPSED + where), params).fetchone()
        if row is not None and row[-1]:
            conn.execute(self._sql(_INTERRUPT + f" AND lease_until < {_NOW}"), ([str(row[0])],))
            row = conn.execute(self._sql(_SELECT_LAPSED + where), params).fetchone()
        return run_record(row[:-1]) if row is not None else None

    def _renew(self, run_ids: Sequence[str], lease_s: float) -> None:
        with self._pool.connection() as conn, translated("renewing run leases"):
            conn.execute(
                self._sql(
                    f"UPDATE {{s}}.runs SET lease_until = {_NOW} + %s "  # noqa: S608 - constants
                    "WHERE status = 'running' AND run_id = ANY(%s)"
                ),
                (lease_s, list(run_ids)),
            )

    def _interrupt(self, run_ids: Sequence[str]) -> None:
        with self._pool.connection() as conn, translated("marking runs interrupted"):
            conn.execute(self._sql(_INTERRUPT), (list(run_ids),))

    def record_usage(self, records: Sequence[UsageRecord]) -> None:
        """`core.usage.UsageSink`: queue the records for the next group commit (within one
        commit of now); never raises (`adapters.usage_writer`)."""
        self._usage.add(records)

    def _write_usage(self, records: Sequence[UsageRecord]) -> None:
        """One group of records in one transaction (`UsageWriter`'s `write`): `RetrievalError`
        when the store cannot be written, the driver's `DataError` when a record's values are
        refused (`bigint out of range` for a token count beyond 64 bits)."""
        try:
            with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(
                    self._sql(
                        f"INSERT INTO {{s}}.usage ({USAGE_COLUMNS}) "  # noqa: S608 - constants
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    ),
                    [usage_values(r) for r in records],
                )
        except psycopg.DataError:
            raise  # a record's values: the writer tries each record alone
        except psycopg.Error as error:
            raise store_error("recording usage", error) from error

    def read_usage(
        self, *, since: str | None = None, subject: str | None = None, limit: int = 10_000
    ) -> list[UsageRecord]:
        """`core.usage.UsageLog`: records at or after `since`, of `subject`, oldest first
        (after this process's own records queued before the call are written)."""
        self._usage.flush()
        with self._pool.connection() as conn, translated("reading usage"):
            rows = conn.execute(
                self._sql(
                    f"SELECT {USAGE_COLUMNS} FROM {{s}}.usage "  # noqa: S608 - constants
                    "WHERE at >= %s AND (%s::text IS NULL OR subject = %s) "
                    "ORDER BY at, id LIMIT %s"
                ),
                (since or "", subject, subject, limit),
            ).fetchall()
        return [usage_record(row) for row in rows]

    def prune(self, before: str, *, usage: bool = False) -> tuple[int, int]:
        """`SqliteRunStore.prune`: the finished runs created before `before` deleted (their
        answers, evidence and idempotency keys), and with `usage` the usage records before it;
        (runs, usage records) deleted. The rows' space is PostgreSQL's to reclaim (VACUUM)."""
        self._usage.flush()
        with (
            self._pool.connection() as conn,
            translated("pruning runs"),
            conn.transaction(),
            conn.cursor() as cursor,
        ):
            cursor.execute(self._sql(_PRUNE_RUNS), (before,))
            runs = cursor.rowcount
            used = 0
            if usage:
                cursor.execute(self._sql("DELETE FROM {s}.usage WHERE at < %s"), (before,))
                used = cursor.rowcount
        return runs, used

    def close(self) -> None:
        """Write the queued usage records, close the pool; later calls raise
        `STORE_UNAVAILABLE`. Idempotent."""
        self._leases.close()  # marks the runs still going interrupted
        self._usage.close()
        self._pool.close()

    def _sql(self, template: str) -> sql.Composed:
        return schema_sql(self._schema, template)


def _reject_nul(*values: str | None) -> None:
    if any(v is not None and "\x00" in v for v in values):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "run identifiers must not contain the NUL character (U+0000).",
            reason=InvalidRequestReason.NUL_CHARACTER,
        )

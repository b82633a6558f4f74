"""A read-only PostgreSQL store (`store.readOnly`: a hot standby, a role without write rights)
creates and migrates nothing, as a read-only SQLite store: a schema that is not there, or one of
an earlier version, is refused with the words SQLite uses and left exactly as it was.

A black-box probe saw a read-only host create the whole schema before refusing to start
("a read-only store creates nothing"), and migrate an earlier release's schema at its start.
The run records beside it stay writable: runs are still recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres import PgRunStore, PgVectorStore
from retrieval_host.adapters.postgres.pool import ConnectionPool, transaction
from retrieval_host.adapters.postgres.run_store import SCHEMA_VERSION as RUN_SCHEMA_VERSION
from retrieval_host.adapters.postgres.schema import VECTOR_SCHEMA_VERSION, session_setup
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import LexicalDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1
from retrieval_host.core.run_ports import RunRecord
from tests.support.pg import connect
from tests.support.previous_vector_store import old_vectors, pg_v2_schema
from tests.support.run_records import a_result
from tests.support.sqlite_store import descriptor

# An earlier release's corpus, opened with its stored analyzer (as `test_lexical_migration`).
OPENED = replace(descriptor("c1"), lexical=LexicalDescriptor(ANALYZER_EN_SNOWBALL_1))
OLD = {("ns", "otters"): ["Otters hold hands while they sleep.", "Sea otters eat urchins."]}


def refused(call: Callable[[], PgVectorStore]) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        call().close()  # were it opened: closed, so that the assertion is the only failure
    return excinfo.value


def tables(dsn: str, schema: str) -> list[str]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        ).fetchall()
    return [str(r[0]) for r in rows]


def versions(dsn: str, schema: str) -> list[tuple[str, int]]:
    with connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT component, version FROM {}.schema_version ORDER BY 1").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def test_a_read_only_store_on_a_schema_that_is_not_there_creates_nothing(
    pg_dsn: str, pg_schema: str
) -> None:
    error = refused(lambda: PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=True))
    assert (error.code, error.reason) == (ErrorCode.STORE_UNAVAILABLE, "missing-store")
    assert pg_schema in error.detail and "creates nothing" in error.detail
    with connect(pg_dsn) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,)
        ).fetchone()
    assert found is None


def test_a_read_only_host_refuses_a_schema_holding_only_run_records_and_still_records_runs(
    pg_dsn: str, pg_schema: str
) -> None:
    # The host opens its run records first (`example_acl.create_driver`): they are writable
    # and make the schema; the read-only vector store must still not add its tables to it.
    runs = PgRunStore.open(pg_dsn, schema=pg_schema)
    try:
        error = refused(lambda: PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=True))
        assert (error.code, error.reason) == (ErrorCode.STORE_UNAVAILABLE, "missing-store")
        assert "vector-store" in error.detail
        assert tables(pg_dsn, pg_schema) == ["runs", "schema_version", "usage"]
        assert versions(pg_dsn, pg_schema) == [("run-store", RUN_SCHEMA_VERSION)]

        # Once a writable store made it, the read-only one serves it, and runs are recorded.
        PgVectorStore.open(pg_dsn, schema=pg_schema).close()
        with PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=True) as reader:
            assert reader.read_only
            record = RunRecord("run-ro", "alice", "k1", "fp", "running", "2026-01-01T00:00:00Z")
            assert runs.begin(record) is None
            runs.complete("run-ro", a_result("run-ro"))
            stored = runs.get("run-ro")
            assert stored is not None and stored.status == "completed"

    finally:
        runs.close()


def test_a_read_only_store_refuses_an_earlier_schema_version_and_leaves_it_unmigrated(
    pg_dsn: str, pg_schema: str
) -> None:
    pg_v2_schema(pg_dsn, pg_schema, descriptor("c1"), OLD)
    before = tables(pg_dsn, pg_schema)

    error = refused(lambda: PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=True))
    assert error.code is ErrorCode.STORE_READ_ONLY
    assert f"schema version {VECTOR_SCHEMA_VERSION}" in error.detail
    assert "is 2" in error.detail and "open it writable once" in error.detail
    assert versions(pg_dsn, pg_schema) == [("vector-store", 2)]
    assert tables(pg_dsn, pg_schema) == before
    with connect(pg_dsn) as conn:
        added = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'sources' AND column_name IN ('media_type', 'indexed_at')",
            (pg_schema,),
        ).fetchall()
    assert added == []

    # Opened writable once (migrated), the read-only store serves the old passages.
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()
    assert versions(pg_dsn, pg_schema) == [("vector-store", VECTOR_SCHEMA_VERSION)]
    with PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=True) as reader:
        reader.open_corpus(OPENED)
        hits = reader.search(
            "c1", "ns", {"otters": "r1"}, old_vectors("otters", 2, 8)[1], 1, CancelToken()
        )
        assert [h.chunk_id for h in hits] == ["otters:1"]


def test_a_read_only_session_s_transactions_cannot_write(pg_dsn: str, pg_schema: str) -> None:
    # `transaction` set READ WRITE on every block, overriding the read-only session default.
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()
    create = sql.SQL("CREATE TABLE {}.stray (id int)").format(sql.Identifier(pg_schema))
    reading = ConnectionPool(pg_dsn, 1, session_setup(30_000, True))
    try:
        with (
            reading.connection() as conn,
            pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
            transaction(conn),
        ):
            conn.execute(create)
    finally:
        reading.close()
    assert "stray" not in tables(pg_dsn, pg_schema)

    # A writable session still writes, also on a connection a read-only block used before.
    writing = ConnectionPool(pg_dsn, 1, session_setup(30_000, False))
    try:
        with writing.connection() as conn:
            with transaction(conn, repeatable_read=True, read_only=True):
                conn.execute("SELECT 1")
            with transaction(conn):
                conn.execute(create)
    finally:
        writing.close()
    assert "stray" in tables(pg_dsn, pg_schema)


def test_a_read_only_store_does_not_create_the_pgvector_extension(pg_dsn: str) -> None:
    database = f"rh_ro_nopgv_{time.monotonic_ns() % 10**9}"
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        params = conninfo_to_dict(pg_dsn)
        params["dbname"] = database
        dsn = make_conninfo("", **params)
        error = refused(lambda: PgVectorStore.open(dsn, read_only=True))
        assert (error.code, error.reason) == (ErrorCode.STORE_UNAVAILABLE, "pgvector-missing")
        assert "read-only" in error.detail
        with connect(dsn) as conn:
            found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
        assert found is None
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))

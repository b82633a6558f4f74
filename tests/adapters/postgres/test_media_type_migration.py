"""The PostgreSQL vector store's migration from `vector-store` 3 to 4 gives a source without a
media type the one its metadata names only when ingestion wrote it: every passage id is the id
ingestion derives for that passage (probe U, session 42; the cases are the SQLite test's)."""

from __future__ import annotations

import pytest
from psycopg import sql

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.postgres.schema import VECTOR_SCHEMA_VERSION
from retrieval_host.core.inspection import SourceFilter
from tests.adapters.sqlite.test_media_type_migration import (
    CASES,
    EXPECTED,
    fail_on_batch,
    listed_types,
    small_batches,
    write_cases,
)
from tests.support.pg import connect, vector_store_version


def _raw(dsn: str, schema: str) -> tuple[int, dict[tuple[str, str], str | None]]:
    with connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT namespace, source_id, media_type FROM {}.sources").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return vector_store_version(dsn, schema), {(str(r[0]), str(r[1])): r[2] for r in rows}


def _previous_schema(dsn: str, schema: str) -> None:
    """A schema of `vector-store` 3, the previous main's: its tables are this release's (the
    new version changes data only), with no media type recorded."""
    with PgVectorStore.open(dsn, schema=schema) as store:
        write_cases(store)
    with connect(dsn) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.schema_version SET version = 3 WHERE component = 'vector-store'"
            ).format(sql.Identifier(schema))
        )
    assert _raw(dsn, schema) == (3, dict.fromkeys(EXPECTED))


def test_only_sources_whose_every_passage_id_is_ingestions_own_get_a_media_type(
    pg_dsn: str, pg_schema: str
) -> None:
    _previous_schema(pg_dsn, pg_schema)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        assert listed_types(store) == EXPECTED
        markdown = SourceFilter(media_type="text/markdown")
        listed = store.list_sources(
            "c1", "ns", {c.source_id: "r1" for c in CASES}, after=None, limit=100
        )
        assert [s.id for s in listed if markdown.keeps(s)] == ["guide", "ropes", "zz-ingested"]
    assert _raw(pg_dsn, pg_schema) == (VECTOR_SCHEMA_VERSION, EXPECTED)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:  # again: nothing changes
        assert listed_types(store) == EXPECTED


def test_the_backfill_decides_alike_across_pages_and_batches(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _previous_schema(pg_dsn, pg_schema)
    small_batches(monkeypatch)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        assert listed_types(store) == EXPECTED
    assert _raw(pg_dsn, pg_schema) == (VECTOR_SCHEMA_VERSION, EXPECTED)


def test_a_backfill_that_fails_midway_leaves_the_schema_as_it_was(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _previous_schema(pg_dsn, pg_schema)
    small_batches(monkeypatch)
    batches = fail_on_batch(monkeypatch, failing=3)  # two batches recorded a type by then
    with pytest.raises(RuntimeError, match="the migration stops here"):
        PgVectorStore.open(pg_dsn, schema=pg_schema)
    assert batches() == 3
    assert _raw(pg_dsn, pg_schema) == (3, dict.fromkeys(EXPECTED))  # one transaction
    monkeypatch.undo()
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        assert listed_types(store) == EXPECTED

"""A host configured for a PostgreSQL database that has nothing in it yet, not even the
pgvector extension, starts and creates what it needs, as the deployment files say ("The store
creates the `vector` extension and its schema on first start"). Probe H (session 38) found
the start's read-only look at the stored descriptors refusing such a database: the check ran
in a read-only session, which may not create the extension, and took its absence for a
read-only store's refusal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres.catalog import peek_descriptors
from tests.support.observability import host_process
from tests.support.pg import connect

NOTE = b"# Otters\n\nSea otters hold hands while they sleep so that they do not drift apart.\n"


@pytest.fixture
def empty_database(pg_dsn: str) -> Iterator[str]:
    """The DSN of a database just created: no extension, no schema of ours."""
    database = f"rh_fresh_{time.monotonic_ns() % 10**9}"
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    params = conninfo_to_dict(pg_dsn)
    params["dbname"] = database
    try:
        yield make_conninfo("", **params)
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


def _has_pgvector(dsn: str) -> bool:
    with connect(dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    return found is not None


def test_peeking_at_a_database_without_pgvector_finds_no_store_and_creates_nothing(
    empty_database: str,
) -> None:
    assert peek_descriptors(empty_database, "retrieval") == {}
    assert not _has_pgvector(empty_database)  # the peek only reads


def test_a_host_starts_on_an_empty_database_and_serves_what_it_indexes(
    tmp_path: Path, empty_database: str
) -> None:
    with host_process(
        tmp_path / "host",
        subjects={"alice": []},
        store={"postgresDsn": {"env": "RH_TEST_PG_DSN"}},
        environ={"RH_TEST_PG_DSN": empty_database},
    ) as host:
        with host.client("alice") as alice:
            indexed = alice.post(
                "/v1/retrieval/ingest",
                params={"corpus": "library", "sourceId": "otters"},
                content=NOTE,
                headers={"Content-Type": "text/markdown"},
            )
            assert indexed.status_code == 200, indexed.text
            found = alice.post(
                "/v1/retrieval/search",
                json={"corpus": "library", "query": "Why do sea otters hold hands?"},
            ).json()
        assert [hit["source"]["id"] for hit in found["hits"]] == ["otters"]
    assert _has_pgvector(empty_database)

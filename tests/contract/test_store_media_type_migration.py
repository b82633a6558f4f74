"""A store whose sources an earlier release ingested before sources recorded their media type
gets it back at open, from the metadata ingestion wrote it into, over every store adapter.

A black-box probe found them listed as `mediaType: null` after the migration that added the
column, left out by the listing's media-type filter (and the console's), and kept so by an
`unchanged` re-ingest. Prepared passages' sources stay without a media type (by contract),
whatever `mediaType` key their own metadata holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import apsw
import numpy as np
import psycopg
import pytest
from psycopg import sql

from retrieval_host.adapters.postgres.schema import VECTOR_SCHEMA_VERSION
from retrieval_host.adapters.sqlite.tables import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from retrieval_host.core.descriptor import LexicalDescriptor
from retrieval_host.core.inspection import SourceFilter
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1
from retrieval_host.core.models import JSONValue
from retrieval_host.core.validation import derived_chunk_id
from tests.contract.conftest import ContractStore, StoreHarness
from tests.contract.test_store_contract import LIMITS
from tests.support.pg import schema_for, shared_dsn
from tests.support.previous_vector_store import pg_v1_schema, sqlite_v1_database
from tests.support.sqlite_store import descriptor, revision, unit_vectors

CURRENT_VERSION = {"sqlite": SQLITE_SCHEMA_VERSION, "pgvector": VECTOR_SCHEMA_VERSION}
# The schema versions of the previous main: the tables of this release (the backfill after them
# changes data only), so a store of this release marked with them is a store it wrote.
PREVIOUS_VERSION = {"sqlite": 4, "pgvector": 3}
OPENED = replace(descriptor("c1"), lexical=LexicalDescriptor(ANALYZER_EN_SNOWBALL_1))
TEXTS = ("First passage of the document.", "Second passage of the document.")
INGESTED = {  # source id -> the type ingestion wrote into its metadata
    "a-pdf": "application/pdf",
    "a-markdown": "text/markdown",
    "an-email": "message/rfc822",
    "a-mailbox": "application/mbox",
    "a-text": "text/plain",
    "a-page": "text/html",
}


def derived_ids(source_id: str, rev: str = "r1") -> list[str]:
    return [derived_chunk_id(source_id, rev, i, t) for i, t in enumerate(TEXTS)]


# source id -> (passage ids, metadata, media type stored by the previous main, expected after)
CASES: Mapping[str, tuple[Sequence[str], Mapping[str, JSONValue], str | None, str | None]] = {
    **{
        sid: (derived_ids(sid), {"mediaType": kind, "lineCount": 2}, None, kind)
        for sid, kind in INGESTED.items()
    },
    # Prepared passages with a `mediaType` key of the caller's own: no type by contract.
    "prepared": (["prepared:0", "prepared:1"], {"mediaType": "text/markdown"}, None, None),
    # Ingestion's shape is lowercase hex; a prepared id in capitals is not one of its ids.
    "capitals": (
        ["p" + i[1:].upper() for i in derived_ids("capitals")],
        {"mediaType": "text/markdown"},
        None,
        None,
    ),
    # Every passage id must have ingestion's shape, not just one.
    "mixed": ([derived_ids("mixed")[0], "mixed:1"], {"mediaType": "text/plain"}, None, None),
    # Only a type the host ingests; anything else stays unknown.
    "other-type": (derived_ids("other-type"), {"mediaType": "image/png"}, None, None),
    "not-text": (derived_ids("not-text"), {"mediaType": 7}, None, None),
    # A type already recorded is never replaced by the metadata's.
    "recorded": (
        derived_ids("recorded"),
        {"mediaType": "text/markdown"},
        "text/plain",
        "text/plain",
    ),
}
ALLOWED = dict.fromkeys(CASES, "r1")


def _write(store: ContractStore) -> None:
    for n, (sid, (ids, metadata, recorded, _)) in enumerate(CASES.items()):
        source, chunks = revision(
            sid,
            "r1",
            unit_vectors(np.random.default_rng(n), len(TEXTS)),
            metadata=metadata,
            texts=TEXTS,
            chunk_ids=ids,
        )
        store.replace_source(
            "c1",
            "ns",
            replace(source, media_type=recorded),
            chunks,
            expected_revision=None,
            limits=LIMITS,
        )


def _set_version(harness: StoreHarness, version: int | None = None) -> int:
    """The store's schema version, after setting it when `version` is given."""
    if harness.kind == "sqlite":
        db = apsw.Connection(str(harness.location / "store.db"))
        try:
            if version is not None:
                db.execute(f"PRAGMA user_version={int(version)}")
            return int(str(db.execute("PRAGMA user_version").fetchall()[0][0]))
        finally:
            db.close()
    table = sql.Identifier(schema_for(harness.location), "schema_version")
    with psycopg.connect(shared_dsn(), autocommit=True) as conn:
        if version is not None:
            conn.execute(
                sql.SQL("UPDATE {} SET version = %s WHERE component = 'vector-store'").format(
                    table
                ),
                (version,),
            )
        row = conn.execute(
            sql.SQL("SELECT version FROM {} WHERE component = 'vector-store'").format(table)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _media_types(store: ContractStore) -> dict[str, str | None]:
    listed = store.list_sources("c1", "ns", ALLOWED, after=None, limit=100)
    return {s.id: s.media_type for s in listed}


def test_sources_ingested_before_media_types_get_theirs_from_their_metadata_at_open(
    harness: StoreHarness,
) -> None:
    # The database of the previous main: its tables are this release's (the new version only
    # fills data), its sources as the column's migration left them, and its version number.
    store = harness.open()
    store.open_corpus(descriptor("c1"))
    _write(store)
    assert set(_media_types(store).values()) == {None, "text/plain"}
    store.close()
    _set_version(harness, PREVIOUS_VERSION[harness.kind])

    store = harness.open()
    store.open_corpus(descriptor("c1"))
    assert _set_version(harness) == CURRENT_VERSION[harness.kind]
    found = _media_types(store)
    assert found == {sid: case[3] for sid, case in CASES.items()}
    listed = store.list_sources("c1", "ns", ALLOWED, after=None, limit=100)
    assert {s.id: dict(s.metadata) for s in listed} == {
        sid: dict(case[1]) for sid, case in CASES.items()
    }  # the metadata itself is untouched
    markdown = SourceFilter(media_type="text/markdown")
    assert [s.id for s in listed if markdown.keeps(s)] == ["a-markdown"]
    again = harness.open()  # opening the migrated store again changes nothing
    again.open_corpus(descriptor("c1"))
    assert _media_types(again) == found


@pytest.mark.parametrize("kind", sorted(set(INGESTED.values())))
def test_a_store_of_the_first_release_gets_the_types_of_what_it_ingested(
    harness: StoreHarness, kind: str
) -> None:
    # The layout of the release before the lexical index, migrated through every version at
    # once; its ingestion wrote ids of the derived shape and the type into the metadata.
    ids = derived_ids("doc")
    metadata = f'{{"mediaType":"{kind}"}}'
    if harness.kind == "sqlite":
        harness.location.chmod(0o700)
        path = harness.location / "store.db"
        sqlite_v1_database(path, descriptor("c1"), {("ns", "doc"): TEXTS})
        db = apsw.Connection(str(path))
        try:
            with db:
                db.execute("UPDATE sources SET metadata_json = ?", (metadata,))
                for ordinal, chunk_id in enumerate(ids):
                    db.execute(
                        "UPDATE chunks SET chunk_id = ? WHERE ordinal = ?", (chunk_id, ordinal)
                    )
        finally:
            db.close()
    else:
        schema = schema_for(harness.location)
        pg_v1_schema(shared_dsn(), schema, descriptor("c1"), {("ns", "doc"): TEXTS})
        s = sql.Identifier(schema)
        with psycopg.connect(shared_dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {}.sources SET metadata_json = %s, metadata = %s::jsonb").format(s),
                (metadata, metadata),
            )
            for ordinal, chunk_id in enumerate(ids):
                conn.execute(
                    sql.SQL("UPDATE {}.chunks SET chunk_id = %s WHERE ordinal = %s").format(s),
                    (chunk_id, ordinal),
                )

    store = harness.open()
    store.open_corpus(OPENED)
    assert _set_version(harness) == CURRENT_VERSION[harness.kind]
    [listed] = store.list_sources("c1", "ns", {"doc": "r1"}, after=None, limit=9)
    assert (listed.media_type, listed.indexed_at) == (kind, None)
    assert SourceFilter(media_type=kind.upper()).keeps(listed)

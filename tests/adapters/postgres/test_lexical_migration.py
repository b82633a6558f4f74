"""A schema of the release before the lexical index (vector-store version 1) is migrated at
open: its lexical index is built from the stored text in the migration's transaction, without
re-embedding, and then ranks exactly as a store written by this release."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import numpy as np
import psycopg
import pytest
from psycopg import sql

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.postgres.schema import VECTOR_SCHEMA_VERSION
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import LexicalDescriptor
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1, analyze, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.support.host import wait_until
from tests.support.lexical_reference import reference
from tests.support.pg import connect, vector_store_version
from tests.support.previous_vector_store import old_vectors, pg_v1_schema, pg_v1_write
from tests.support.sqlite_store import descriptor, revision, unit_vectors

# What the service opens an old corpus with: its stored analyzer (`stored_lexical`).
OPENED = replace(descriptor("c1"), lexical=LexicalDescriptor(ANALYZER_EN_SNOWBALL_1))
OLD = {
    ("ns", "cells"): ["Stem cells divide.", "Cell division needs cyclins."],
    ("ns", "virus"): ["A virus replicates inside cells.", "Vaccines prime immunity."],
    ("other", "flood"): ["virus virus virus"] * 5,
}
NS_DOCS = {sid: texts for (ns, sid), texts in OLD.items() if ns == "ns"}


def test_a_schema_of_the_previous_release_gets_its_lexical_index_at_open(
    pg_dsn: str, pg_schema: str
) -> None:
    pg_v1_schema(pg_dsn, pg_schema, descriptor("c1"), OLD)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        store.open_corpus(OPENED)  # the old descriptor takes the first analyzer
        grant = {"cells": "r1", "virus": "r1"}
        for query in ("cells virus", "division"):
            hits = store.lexical_search(
                "c1", "ns", grant, query_terms(query, ANALYZER_EN_SNOWBALL_1), 10, CancelToken()
            )
            expected = reference(NS_DOCS, set(grant), query)
            assert [(h.chunk_id, round(h.score, 9)) for h in hits] == [
                (c, round(s, 9)) for c, s in expected
            ]
        dense = store.search("c1", "ns", grant, old_vectors("cells", 2, 8)[1], 1, CancelToken())
        assert [h.chunk_id for h in dense] == ["cells:1"]
        # Writes after the migration keep the namespace statistics whole.
        source, chunks = revision(
            "virus",
            "r2",
            unit_vectors(np.random.default_rng(1), 1),
            texts=["Influenza spreads in winter."],
        )
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision="r1", limits=CapacityLimits()
        )
        assert store.delete_source("c1", "other", "flood", "r1") == 5
        docs = {**NS_DOCS, "virus": ["Influenza spreads in winter."]}
        grant = {"cells": "r1", "virus": "r2"}
        hits = store.lexical_search(
            "c1", "ns", grant, query_terms("cells", ANALYZER_EN_SNOWBALL_1), 10, CancelToken()
        )
        assert [(h.chunk_id, round(h.score, 9)) for h in hits] == [
            (c, round(s, 9)) for c, s in reference(docs, set(grant), "cells")
        ]

    assert vector_store_version(pg_dsn, pg_schema) == VECTOR_SCHEMA_VERSION
    with connect(pg_dsn) as conn:
        s = sql.Identifier(pg_schema)
        missing = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.chunks WHERE term_count IS NULL").format(s)
        ).fetchone()
        assert missing == (0,)
        spaces = conn.execute(
            sql.SQL(
                "SELECT namespace, passages, total_terms FROM {}.lexical_spaces ORDER BY namespace"
            ).format(s)
        ).fetchall()
        terms = sum(
            len(analyze(t, ANALYZER_EN_SNOWBALL_1)) for texts in docs.values() for t in texts
        )
        assert spaces == [("ns", 3, terms), ("other", 0, 0)]
    # A second open finds the current version and changes nothing.
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        store.open_corpus(OPENED)
        hits = store.lexical_search(
            "c1",
            "ns",
            {"virus": "r2"},
            query_terms("influenza", ANALYZER_EN_SNOWBALL_1),
            3,
            CancelToken(),
        )
        assert [h.chunk_id for h in hits] == ["virus:0"]


def test_what_an_earlier_replica_wrote_after_the_migration_is_analyzed_at_the_next_open(
    pg_dsn: str, pg_schema: str
) -> None:
    # A black-box test: in a rolling upgrade, a replica of the release before the lexical
    # index kept serving after a new one migrated the schema; its writes (no terms) were left
    # out of lexical search for good, and its deletes left the namespace's counts behind.
    pg_v1_schema(pg_dsn, pg_schema, descriptor("c1"), OLD)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        store.open_corpus(OPENED)  # migrated
    late = {("ns", "late"): ["Late cells divide slowly.", "Division checkpoints."]}
    pg_v1_write(pg_dsn, pg_schema, descriptor("c1"), late)
    s = sql.Identifier(pg_schema)
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DELETE FROM {}.sources WHERE source_id = 'flood'").format(s))
        conn.commit()
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        store.open_corpus(OPENED)
        docs = {**NS_DOCS, "late": late[("ns", "late")]}
        grant = {sid: "r1" for sid in docs}
        for query in ("cells", "division"):
            hits = store.lexical_search(
                "c1", "ns", grant, query_terms(query, ANALYZER_EN_SNOWBALL_1), 10, CancelToken()
            )
            assert [(h.chunk_id, round(h.score, 9)) for h in hits] == [
                (c, round(s, 9)) for c, s in reference(docs, set(grant), query)
            ]
    with connect(pg_dsn) as conn:
        spaces = conn.execute(
            sql.SQL(
                "SELECT namespace, passages, total_terms FROM {}.lexical_spaces ORDER BY namespace"
            ).format(s)
        ).fetchall()
    terms = sum(len(analyze(t, ANALYZER_EN_SNOWBALL_1)) for texts in docs.values() for t in texts)
    assert spaces == [("ns", 6, terms), ("other", 0, 0)]


def test_without_migration_an_earlier_schema_is_refused_and_the_migration_is_logged(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Black-box tests: this release's `ingest` migrated the schema under the earlier host
    # still serving it, and no log line said a migration had happened.
    pg_v1_schema(pg_dsn, pg_schema, descriptor("c1"), OLD)
    with pytest.raises(RetrievalError) as refused:
        PgVectorStore.open(pg_dsn, schema=pg_schema, migrate=False)
    assert (refused.value.code, refused.value.reason) == ("UNSAFE_STORE", "schema-version")
    assert "start the host of this release first" in refused.value.detail
    assert vector_store_version(pg_dsn, pg_schema) == 1
    caplog.set_level(logging.INFO, logger="retrieval_host.adapters.postgres.schema")
    with PgVectorStore.open(pg_dsn, schema=pg_schema):
        pass
    assert vector_store_version(pg_dsn, pg_schema) == VECTOR_SCHEMA_VERSION
    said = [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()]
    assert said == [
        f"migrated the vector-store schema {pg_schema!r} from version 1 to "
        f"{VECTOR_SCHEMA_VERSION} (an earlier release can no longer open it)"
    ]


def test_the_recount_at_open_keeps_a_concurrent_writers_counts(pg_dsn: str, pg_schema: str) -> None:
    # A black-box test: a writer (index or delete on another replica) holding its namespace's
    # counts when a store opened had its change overwritten by the recount, computed from the
    # snapshot taken before it committed; the counts fell behind the rows, and deleting the
    # last source then broke their check (503) until the next open.
    pg_v1_schema(pg_dsn, pg_schema, descriptor("c1"), OLD)
    with PgVectorStore.open(pg_dsn, schema=pg_schema) as store:
        store.open_corpus(OPENED)  # migrated: counts kept by writers from now on
    s = sql.Identifier(pg_schema)

    def counts(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...] | None:
        return conn.execute(
            sql.SQL(
                "SELECT l.passages, (SELECT count(c.term_count) FROM {}.chunks c WHERE "
                "c.corpus_id = l.corpus_id AND c.namespace = l.namespace) FROM {}.lexical_spaces "
                "l WHERE l.namespace = 'ns'"
            ).format(s, s)
        ).fetchone()

    with psycopg.connect(pg_dsn) as writer, connect(pg_dsn) as watcher:
        # As the store's index does in one transaction: a passage, then the namespace's counts.
        writer.execute(
            sql.SQL(
                "INSERT INTO {}.chunks (source_pk, corpus_id, namespace, chunk_id, ordinal, text, "
                "page, start_line, end_line, document_id, dimensions, embedding, term_count) "
                "SELECT source_pk, corpus_id, namespace, 'late-0', 100000, text, page, "
                "start_line, end_line, document_id, dimensions, embedding, term_count "
                "FROM {}.chunks WHERE namespace = 'ns' AND term_count IS NOT NULL LIMIT 1"
            ).format(s, s)
        )
        writer.execute(
            sql.SQL(
                "UPDATE {}.lexical_spaces SET passages = passages + 1 WHERE namespace = 'ns'"
            ).format(s)
        )
        opened = threading.Thread(
            target=lambda: PgVectorStore.open(pg_dsn, schema=pg_schema, pool_size=1).close()
        )
        opened.start()
        wait_until(
            lambda: (
                watcher.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
                ).fetchone()
                == (1,)
            ),
            what="the open's recount waiting for the writer",
        )
        writer.commit()
        opened.join(timeout=60)
        assert not opened.is_alive()
        assert counts(watcher) == (5, 5)

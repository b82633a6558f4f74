"""A vector store file of the release before the lexical index (schema version 1) opens,
migrates to the current version and gets its lexical index from the stored text, without
re-embedding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import apsw
import numpy as np

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.sqlite.tables import SCHEMA_VERSION
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import LexicalDescriptor
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.support.lexical_reference import reference
from tests.support.previous_vector_store import old_vectors, sqlite_v1_database
from tests.support.sqlite_store import descriptor, revision, unit_vectors

# What the service opens an old corpus with: its stored analyzer (`stored_lexical`).
OPENED = replace(descriptor("c1"), lexical=LexicalDescriptor(ANALYZER_EN_SNOWBALL_1))
OLD = {
    ("ns", "cells"): ["Stem cells divide.", "Cell division needs cyclins."],
    ("ns", "virus"): ["A virus replicates inside cells.", "Vaccines prime immunity."],
    ("other", "flood"): ["virus virus virus"] * 5,
}
NS_DOCS = {sid: texts for (ns, sid), texts in OLD.items() if ns == "ns"}


def test_a_store_of_the_previous_release_gets_its_lexical_index_at_open(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "store.db"
    sqlite_v1_database(path, descriptor("c1"), OLD)

    with SqliteVectorStore.open(path) as store:
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
        # The stored vectors are untouched and still searched.
        dense = store.search("c1", "ns", grant, old_vectors("cells", 2, 8)[1], 1, CancelToken())
        assert [h.chunk_id for h in dense] == ["cells:1"]
        # A write after the migration keeps the statistics whole.
        source, chunks = revision(
            "virus",
            "r2",
            unit_vectors(np.random.default_rng(1), 1),
            texts=["Influenza spreads in winter."],
        )
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision="r1", limits=CapacityLimits()
        )
        docs = {**NS_DOCS, "virus": ["Influenza spreads in winter."]}
        hits = store.lexical_search(
            "c1",
            "ns",
            {"cells": "r1", "virus": "r2"},
            query_terms("cells", ANALYZER_EN_SNOWBALL_1),
            10,
            CancelToken(),
        )
        assert [h.chunk_id for h in hits] == [c for c, _ in reference(docs, {"cells"}, "cells")]

    raw = apsw.Connection(str(path))
    try:
        assert raw.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
        assert raw.execute("SELECT COUNT(*) FROM chunks WHERE terms IS NULL").fetchall() == [(0,)]
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        raw.close()
    # Opening the migrated file again changes nothing and finds the same index.
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(OPENED)
        hits = store.lexical_search(
            "c1",
            "other",
            {"flood": "r1"},
            query_terms("virus", ANALYZER_EN_SNOWBALL_1),
            2,
            CancelToken(),
        )
        assert [h.chunk_id for h in hits] == ["flood:0", "flood:1"]


def test_passages_without_stored_terms_are_analyzed_at_load(tmp_path: Path) -> None:
    # A migrated file whose passages have no terms yet (the backfill of another corpus open
    # has not run): the in-memory index analyzes the stored text rather than miss them.
    tmp_path.chmod(0o700)
    path = tmp_path / "store.db"
    sqlite_v1_database(path, descriptor("c1"), OLD)
    SqliteVectorStore.open(path).close()  # migrates; the corpus is not opened, no backfill
    raw = apsw.Connection(str(path))
    try:
        assert raw.execute("SELECT COUNT(*) FROM chunks WHERE terms IS NULL").fetchall() == [
            (len(NS_DOCS["cells"]) + len(NS_DOCS["virus"]) + 5,)
        ]
    finally:
        raw.close()
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(OPENED)
        hits = store.lexical_search(
            "c1",
            "ns",
            {"virus": "r1"},
            query_terms("virus", ANALYZER_EN_SNOWBALL_1),
            5,
            CancelToken(),
        )
        assert [h.chunk_id for h in hits] == ["virus:0"]

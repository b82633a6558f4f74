"""The PostgreSQL store's BM25 statistics over a grant (`adapters/postgres/lexical.py`).

The contract suite checks the scores against a reference in both stores; these tests cover
what only this store keeps: per-revision totals in memory (`SourceTotals`), which must never
outlive the revision they count, even when another store instance rewrites it, and stay exact
when their bound makes them start over.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.postgres.lexical import SourceTotals
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.support.lexical_reference import reference
from tests.support.sqlite_store import descriptor, revision, unit_vectors

DOCS = {
    f"s{i}": [f"otter {'kelp ' * i}rocks", f"river {'otter ' * (i % 3)}stones and kelp"]
    for i in range(8)
}


@pytest.fixture
def stores(pg_dsn: str, pg_schema: str) -> Iterator[tuple[PgVectorStore, PgVectorStore]]:
    """A reader and a writer on one schema, corpus `c1` opened in both."""
    opened = [PgVectorStore.open(pg_dsn, schema=pg_schema) for _ in range(2)]
    for store in opened:
        store.open_corpus(descriptor("c1"))
    yield opened[0], opened[1]
    for store in opened:
        store.close()


def put(store: PgVectorStore, sid: str, rev: str, texts: list[str], expected: str | None) -> None:
    vectors = unit_vectors(np.random.default_rng(1), len(texts))
    source, chunks = revision(sid, rev, vectors, texts=texts)
    store.replace_source(
        "c1", "ns", source, chunks, expected_revision=expected, limits=CapacityLimits()
    )


def ranked(store: PgVectorStore, allowed: dict[str, str], query: str) -> list[tuple[str, float]]:
    hits = store.lexical_search(
        "c1", "ns", allowed, query_terms(query, DEFAULT_ANALYZER), 100, CancelToken()
    )
    return [(h.chunk_id, h.score) for h in hits]


def assert_reference(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert [cid for cid, _ in got] == [cid for cid, _ in expected]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-9)


@pytest.mark.parametrize("limit", [1, 3, 1_000])
def test_kept_totals_stay_exact_however_small_their_bound(
    stores: tuple[PgVectorStore, PgVectorStore], limit: int
) -> None:
    reader, writer = stores
    reader._source_totals = SourceTotals(limit)
    for sid, texts in DOCS.items():
        put(writer, sid, "r1", texts, None)
    grants = [
        {sid: "r1" for sid in DOCS},  # the whole namespace (counted from the rest of it)
        {sid: "r1" for sid in list(DOCS)[:2]},  # a quarter (counted over the grant)
        {sid: "r1" for sid in list(DOCS)[1::2]},  # half
        {sid: "r1" for sid in list(DOCS)[2:]},  # three quarters (minus the rest)
    ]
    for _ in range(2):  # cold, then from what was kept
        for grant in grants:
            assert_reference(
                ranked(reader, grant, "otter kelp"), reference(DOCS, set(grant), "otter kelp")
            )


def test_a_revision_rewritten_by_another_instance_is_counted_anew(
    stores: tuple[PgVectorStore, PgVectorStore],
) -> None:
    reader, writer = stores
    for sid, texts in DOCS.items():
        put(writer, sid, "r1", texts, None)
    quarter = {"s1": "r1", "s2": "r1"}
    assert_reference(ranked(reader, quarter, "kelp"), reference(DOCS, set(quarter), "kelp"))
    # s2 gets a longer revision, then goes back to r1 with other text: a kept total of the
    # old r1 would give the wrong N and average length.
    put(writer, "s2", "r2", ["kelp"] * 5, "r1")
    longer = ["otter otter otter kelp rocks stones river"] * 3
    put(writer, "s2", "r1", longer, "r2")
    docs = {**DOCS, "s2": longer}
    assert_reference(ranked(reader, quarter, "kelp"), reference(docs, set(quarter), "kelp"))

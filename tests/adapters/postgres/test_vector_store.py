"""PostgreSQL-specific behaviour of the pgvector store: schema identity, races, HNSW paths.

The shared behaviour (the port's contract) is the contract suite's; these tests cover what only
a shared database has: writers in several connections at once, a schema that other code may
have touched, and the HNSW index with its exact fallback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_host.adapters.postgres import PgRunStore, PgVectorStore
from retrieval_host.adapters.postgres.run_store import SCHEMA_VERSION as RUN_SCHEMA_VERSION
from retrieval_host.adapters.postgres.schema import VECTOR_SCHEMA_VERSION
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import ApproximateRanking, CapacityLimits
from tests.support.pg import connect
from tests.support.sqlite_store import DIM, descriptor, revision, unit_vectors

LIMITS = CapacityLimits()


@pytest.fixture
def opened(pg_dsn: str, pg_schema: str) -> Iterator[Callable[..., PgVectorStore]]:
    """Opens stores on the test's schema (corpus `c1` opened) and closes them afterwards."""
    stores: list[PgVectorStore] = []

    def open_store(**options: object) -> PgVectorStore:
        store = PgVectorStore.open(pg_dsn, schema=pg_schema, **options)  # type: ignore[arg-type]
        stores.append(store)
        store.open_corpus(descriptor("c1"))
        return store

    yield open_store
    for store in stores:
        store.close()


def expect(code: ErrorCode, reason: str | None, call: Callable[[], object]) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        call()
    assert excinfo.value.code is code, excinfo.value
    if reason is not None:
        assert excinfo.value.reason == reason
    return excinfo.value


def run_together(calls: list[Callable[[], None]]) -> list[BaseException | None]:
    """Run the calls in threads released at once; each slot holds its exception or None."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            calls[i]()
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return outcomes


# --- schema identity -----------------------------------------------------------------------


def test_a_schema_holding_another_applications_tables_is_refused_and_left_alone(
    pg_dsn: str, pg_schema: str
) -> None:
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
        conn.execute(sql.SQL("CREATE TABLE {}.invoices (id int)").format(sql.Identifier(pg_schema)))

    expect(
        ErrorCode.UNSAFE_STORE,
        "unrelated-database",
        lambda: PgVectorStore.open(pg_dsn, schema=pg_schema),
    )

    with connect(pg_dsn) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (pg_schema,)
        ).fetchall()
    assert tables == [("invoices",)]


@pytest.mark.parametrize("read_only", [False, True])
def test_a_newer_schema_version_is_refused(pg_dsn: str, pg_schema: str, read_only: bool) -> None:
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()
    with connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.schema_version SET version = %s WHERE component = 'vector-store'"
            ).format(sql.Identifier(pg_schema)),
            (VECTOR_SCHEMA_VERSION + 1,),
        )
    expect(
        ErrorCode.UNSAFE_STORE,
        "schema-version",
        lambda: PgVectorStore.open(pg_dsn, schema=pg_schema, read_only=read_only),
    )


def test_tables_of_another_shape_are_refused(pg_dsn: str, pg_schema: str) -> None:
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()
    with connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {}.chunks ADD COLUMN extra integer").format(
                sql.Identifier(pg_schema)
            )
        )
    expect(
        ErrorCode.UNSAFE_STORE,
        "unrelated-database",
        lambda: PgVectorStore.open(pg_dsn, schema=pg_schema),
    )


def test_the_vector_and_run_stores_share_one_schema(pg_dsn: str, pg_schema: str) -> None:
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()
    PgRunStore.open(pg_dsn, schema=pg_schema).close()
    PgVectorStore.open(pg_dsn, schema=pg_schema).close()  # reopening checks, creates nothing
    with connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT component, version FROM {}.schema_version ORDER BY 1").format(
                sql.Identifier(pg_schema)
            )
        ).fetchall()
    assert rows == [("run-store", RUN_SCHEMA_VERSION), ("vector-store", VECTOR_SCHEMA_VERSION)]


def test_a_role_that_cannot_create_pgvector_gets_a_typed_error(pg_dsn: str) -> None:
    suffix = f"{time.monotonic_ns() % 10**9}"
    database, role = f"rh_nopgv_{suffix}", f"rh_limited_{suffix}"
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal("limited-secret")
            )
        )
    try:
        params = conninfo_to_dict(pg_dsn)
        params.update(user=role, password="limited-secret", dbname=database)
        error = expect(
            ErrorCode.STORE_UNAVAILABLE,
            "pgvector-missing",
            lambda: PgVectorStore.open(make_conninfo("", **params)),
        )
        assert "CREATE EXTENSION vector" in error.detail
        assert "limited-secret" not in str(error)
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# --- values PostgreSQL cannot hold ------------------------------------------------------------


def test_text_with_a_nul_character_is_refused_and_keeps_the_revision(
    opened: Callable[..., PgVectorStore],
) -> None:
    store = opened()
    v = unit_vectors(np.random.default_rng(0), 2)
    source, chunks = revision("a", "r1", v)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    bad_source, bad_chunks = revision("a", "r2", v, texts=["fine", "nul\x00inside"])
    expect(
        ErrorCode.INVALID_REQUEST,
        "nul-character",
        lambda: store.replace_source(
            "c1", "ns", bad_source, bad_chunks, expected_revision="r1", limits=LIMITS
        ),
    )
    stored = store.get_source("c1", "ns", "a")
    assert stored is not None and stored.revision == "r1"
    assert store.search("c1", "ns", {"a\x00": "r1"}, v[0], 3, CancelToken()) == []


def test_a_delete_reports_reclamation_as_pending(opened: Callable[..., PgVectorStore]) -> None:
    store = opened()
    v = unit_vectors(np.random.default_rng(0), 3)
    source, chunks = revision("a", "r1", v)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    assert store.delete_source("c1", "ns", "a", "r1") == 3
    assert store.reclamation == "pending"


# --- writers in several connections at once ---------------------------------------------------


def test_racing_writers_expecting_the_same_revision_let_exactly_one_win(
    opened: Callable[..., PgVectorStore],
) -> None:
    stores = [opened(), opened()]  # two pools: writers really use separate connections
    rng = np.random.default_rng(1)
    base, base_chunks = revision("a", "r0", unit_vectors(rng, 2))
    stores[0].replace_source("c1", "ns", base, base_chunks, expected_revision=None, limits=LIMITS)

    def write(i: int) -> Callable[[], None]:
        source, chunks = revision("a", f"w{i}", unit_vectors(rng, 2 + i))
        return lambda: stores[i % 2].replace_source(
            "c1", "ns", source, chunks, expected_revision="r0", limits=LIMITS
        )

    outcomes = run_together([write(i) for i in range(8)])

    winners = [i for i, exc in enumerate(outcomes) if exc is None]
    assert len(winners) == 1
    for exc in outcomes:
        if exc is not None:
            assert isinstance(exc, RetrievalError), exc
            assert (exc.code, exc.reason) == (ErrorCode.SOURCE_CONFLICT, "concurrent-writer")
    stored = stores[1].get_source("c1", "ns", "a")
    assert stored is not None
    assert (stored.revision, stored.chunk_count) == (f"w{winners[0]}", 2 + winners[0])


def test_first_writers_of_a_new_source_race_to_one_winner(
    opened: Callable[..., PgVectorStore],
) -> None:
    stores = [opened(), opened()]
    rng = np.random.default_rng(2)

    def write(i: int) -> Callable[[], None]:
        source, chunks = revision("new", f"w{i}", unit_vectors(rng, 3))
        return lambda: stores[i % 2].replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=LIMITS
        )

    outcomes = run_together([write(i) for i in range(6)])

    assert sum(exc is None for exc in outcomes) == 1
    assert all(
        isinstance(exc, RetrievalError) and exc.code is ErrorCode.SOURCE_CONFLICT
        for exc in outcomes
        if exc is not None
    )


def test_racing_sources_cannot_both_pass_the_corpus_limit(
    pg_dsn: str, pg_schema: str, opened: Callable[..., PgVectorStore]
) -> None:
    stores = [opened(), opened()]
    text = "y" * 200
    one = 200 + DIM * 4
    limits = CapacityLimits(max_corpus_payload_bytes=5 * one)  # room for one of the two
    v = unit_vectors(np.random.default_rng(3), 3)

    def write(i: int) -> Callable[[], None]:
        source, chunks = revision(f"s{i}", "r1", v, texts=[text] * 3)
        return lambda: stores[i].replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=limits
        )

    outcomes = run_together([write(0), write(1)])

    assert sum(exc is None for exc in outcomes) == 1
    loser = next(exc for exc in outcomes if exc is not None)
    assert isinstance(loser, RetrievalError) and loser.code is ErrorCode.CAPACITY_EXCEEDED
    assert payload_total(pg_dsn, pg_schema) == 3 * one


def test_racing_sources_with_a_shared_chunk_id_leave_one_owner(
    opened: Callable[..., PgVectorStore],
) -> None:
    stores = [opened(), opened()]
    v = unit_vectors(np.random.default_rng(4), 2)

    def write(i: int) -> Callable[[], None]:
        source, chunks = revision(f"s{i}", "r1", v, chunk_ids=["shared", f"own-{i}"])
        return lambda: stores[i].replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=LIMITS
        )

    for _ in range(3):  # a few rounds: the loser is found before or at the insert
        outcomes = run_together([write(0), write(1)])
        assert sum(exc is None for exc in outcomes) == 1
        loser = next(exc for exc in outcomes if exc is not None)
        assert isinstance(loser, RetrievalError) and loser.code is ErrorCode.CHUNK_ID_CONFLICT
        winner = outcomes.index(None)
        stores[0].delete_source("c1", "ns", f"s{winner}", "r1")


def payload_total(pg_dsn: str, schema: str) -> int:
    with connect(pg_dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT payload_bytes FROM {}.corpora WHERE corpus_id = 'c1'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    assert row is not None
    return int(row[0])


# --- HNSW ---------------------------------------------------------------------------------------


def clustered(
    rng: np.random.Generator, n: int, dim: int, clusters: int = 20
) -> npt.NDArray[np.float32]:
    """Unit vectors around `clusters` centres (HNSW recall on uniform noise is meaningless)."""
    centres = rng.standard_normal((clusters, dim))
    rows: npt.NDArray[np.float64] = centres[rng.integers(0, clusters, n)] + 0.35 * (
        rng.standard_normal((n, dim))
    )
    unit: npt.NDArray[np.float32] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def load(store: PgVectorStore, vectors: npt.NDArray[np.float32], per_source: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(vectors), per_source):
        sid = f"s{start // per_source}"
        source, chunks = revision(sid, "r1", vectors[start : start + per_source])
        store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
        ids.append(sid)
    return ids


def index_scans(pg_dsn: str, schema: str, index: str) -> int:
    with connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_indexes "
            "WHERE schemaname = %s AND indexrelname = %s",
            (schema, index),
        ).fetchone()
    return int(row[0]) if row is not None else 0


def test_hnsw_search_uses_the_index_for_a_broad_grant_with_high_recall(
    pg_dsn: str, pg_schema: str, opened: Callable[..., PgVectorStore]
) -> None:
    rng = np.random.default_rng(5)
    exact = opened()
    vectors = clustered(rng, 4000, DIM)
    ids = load(exact, vectors, 10)
    store = opened(hnsw=True, hnsw_min_rows=100)
    with connect(pg_dsn) as conn:
        valid = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (pg_schema, f"chunks_hnsw_{DIM}"),
        ).fetchone()
    assert valid == (True,)

    allowed = {sid: "r1" for sid in rng.choice(ids, size=len(ids) // 10, replace=False)}
    scans_before = index_scans(pg_dsn, pg_schema, f"chunks_hnsw_{DIM}")
    found = total = 0
    for query in clustered(rng, 20, DIM):
        truth = exact.search("c1", "ns", allowed, query, 10, CancelToken())
        assert not isinstance(truth, ApproximateRanking)
        want = {c.chunk_id for c in truth}
        got = store.search("c1", "ns", allowed, query, 10, CancelToken())
        assert isinstance(got, ApproximateRanking)  # so core adds the lexical index's best
        assert len(got) == 10
        assert all(allowed[c.source_id] == c.revision for c in got)
        assert [c.score for c in got] == sorted((c.score for c in got), reverse=True)
        found += len(want & {c.chunk_id for c in got})
        total += len(want)

    assert found / total >= 0.9
    assert store.search_stats.index_scans == 20
    assert store.counters.approximate_searches == 20  # the metric an operator reads
    assert store.search_stats.exact_fallbacks == 0
    # The planner really walked the HNSW index. A backend flushes its statistics at exit at
    # the latest: close the store's connections, then poll the view until the scans show.
    # The bound only stops a hang: under load a backend took over 10 s to exit and flush.
    store.close()
    deadline = time.monotonic() + 120
    while index_scans(pg_dsn, pg_schema, f"chunks_hnsw_{DIM}") <= scans_before:
        assert time.monotonic() < deadline, "the HNSW index was never scanned"
        time.sleep(0.1)  # each poll opens a connection: not a busy loop


def test_a_grant_the_index_cannot_fill_falls_back_to_the_exact_answer(
    pg_dsn: str, pg_schema: str, opened: Callable[..., PgVectorStore]
) -> None:
    rng = np.random.default_rng(6)
    exact = opened()
    ids = load(exact, clustered(rng, 3000, DIM), 10)
    with connect(pg_dsn) as conn:  # what autovacuum does at a time of its own choosing
        conn.execute(f'ANALYZE "{pg_schema}".chunks')
    # pgvector stops an iterative scan after hnsw.max_scan_tuples; a tiny bound makes a
    # 1 %-grant run out of candidates, which must not shrink the answer. Once autovacuum has
    # analyzed the table, the planner would rather sort the 30 granted rows than walk the
    # index; without sorts and bitmap scans it walks the index, as it does before analysis.
    params = conninfo_to_dict(pg_dsn)
    params["options"] = (
        "-c hnsw.max_scan_tuples=30 -c enable_sort=off -c enable_bitmapscan=off"
        " -c enable_seqscan=off"
    )
    store = PgVectorStore.open(
        make_conninfo("", **params), schema=pg_schema, hnsw=True, hnsw_min_rows=0
    )
    try:
        store.open_corpus(descriptor("c1"))
        allowed = {sid: "r1" for sid in ids[::100]}  # 3 sources, 30 rows of 3000
        query = clustered(rng, 1, DIM)[0]
        got = store.search("c1", "ns", allowed, query, 10, CancelToken())
        want = exact.search("c1", "ns", allowed, query, 10, CancelToken())
        assert [c.chunk_id for c in got] == [c.chunk_id for c in want]
        assert store.search_stats.exact_fallbacks == 1
    finally:
        store.close()


def test_corpora_of_different_dimensions_share_the_tables_with_an_index_each(
    pg_dsn: str, pg_schema: str, opened: Callable[..., PgVectorStore]
) -> None:
    store = opened(hnsw=True, hnsw_min_rows=0)
    store.open_corpus(descriptor("wide", dimensions=2 * DIM))
    rng = np.random.default_rng(7)
    narrow, wide = unit_vectors(rng, 5), unit_vectors(rng, 5, 2 * DIM)
    for corpus, vectors in (("c1", narrow), ("wide", wide)):
        source, chunks = revision("a", "r1", vectors)
        store.replace_source(corpus, "ns", source, chunks, expected_revision=None, limits=LIMITS)

    for corpus, vectors in (("c1", narrow), ("wide", wide)):
        hits = store.search(corpus, "ns", {"a": "r1"}, vectors[2], 5, CancelToken())
        assert hits[0].chunk_id == "a:2"
        assert hits[0].score == pytest.approx(1.0, abs=1e-6)
        assert len(hits) == 5
    with connect(pg_dsn) as conn:
        names = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s "
            "AND indexname LIKE 'chunks_hnsw%%' ORDER BY 1",
            (pg_schema,),
        ).fetchall()
    assert names == [(f"chunks_hnsw_{2 * DIM}",), (f"chunks_hnsw_{DIM}",)]


def test_vectors_are_stored_exactly_as_given(
    pg_dsn: str, pg_schema: str, opened: Callable[..., PgVectorStore]
) -> None:
    store = opened()
    raw = (np.random.default_rng(8).standard_normal((3, DIM)) * 7).astype(np.float32)
    before = raw.copy()
    source, chunks = revision("a", "r1", raw)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    with connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT embedding::real[] FROM {}.chunks ORDER BY ordinal").format(
                sql.Identifier(pg_schema)
            )
        ).fetchall()
    np.testing.assert_array_equal(np.array([r[0] for r in rows], dtype=np.float32), raw)
    np.testing.assert_array_equal(raw, before)  # the caller's array was not normalised in place


def test_the_hnsw_build_gives_its_connection_back_with_the_store_s_statement_timeout(
    opened: Callable[..., PgVectorStore],
) -> None:
    # A review: RESET after the build went to the server's default, and left that pooled
    # connection with no statement timeout at all.
    store = opened(hnsw=True, hnsw_min_rows=0, pool_size=1, statement_timeout_ms=12_345)
    with store._pool.connection() as conn:
        row = conn.execute("SELECT current_setting('statement_timeout')").fetchone()
    assert row == ("12345ms",)

"""Run records and idempotency keys in PostgreSQL: a replay works on any replica."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.postgres import PgRunStore, PgVectorStore
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, RunRecord
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs_model import (
    RunRequest,
    RunRetrieval,
)
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.core.usage import UsageRecord
from retrieval_host.wire.run_storage import STORAGE_VERSION
from retrieval_host.wire.runs import result_to_json
from tests.support.host import wait_until
from tests.support.run_records import (
    OLD_RESULT,
    OLD_RESULT_JSON,
    a_result,
    pg_run_schema_statements,
)


@pytest.fixture
def run_stores(pg_dsn: str, pg_schema: str) -> Iterator[Callable[[], PgRunStore]]:
    opened: list[PgRunStore] = []

    def open_store() -> PgRunStore:
        store = PgRunStore.open(pg_dsn, schema=pg_schema)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def record(run_id: str, subject: str = "alice", key: str | None = "k1") -> RunRecord:
    return RunRecord(run_id, subject, key, "fp-1", "running", "2026-01-01T00:00:00.000Z")


def test_a_key_is_begun_once_per_subject_and_seen_from_another_replica(
    run_stores: Callable[[], PgRunStore],
) -> None:
    here, there = run_stores(), run_stores()
    assert here.begin(record("run-1")) is None
    existing = there.begin(record("run-2"))
    assert existing is not None
    assert (existing.run_id, existing.status, existing.result) == ("run-1", "running", None)
    assert there.begin(record("run-3", subject="bob")) is None  # keys are per subject
    assert there.begin(record("run-4", key=None)) is None  # no key: never a replay
    assert there.begin(record("run-5", key=None)) is None

    here.complete("run-1", a_result("run-1"))
    replayed = there.begin(record("run-6"))
    assert replayed is not None
    assert (replayed.status, replayed.result) == ("completed", a_result("run-1"))
    there.finish("run-1", "failed", "INTERNAL")  # only a running run can end this way
    after = here.get("run-1")
    assert after is not None and (after.status, after.error_code) == ("completed", None)
    there.finish("run-3", "cancelled", "CANCELLED")
    cancelled = here.get("run-3")
    assert cancelled is not None and (cancelled.status, cancelled.error_code) == (
        "cancelled",
        "CANCELLED",
    )
    assert here.get("run-6") is None


def test_racing_begins_of_one_key_insert_exactly_one_record(
    run_stores: Callable[[], PgRunStore],
) -> None:
    stores = [run_stores(), run_stores()]
    barrier = threading.Barrier(8)
    answers: list[RunRecord | None] = [None] * 8
    inserted: list[int] = []

    def begin(i: int) -> None:
        barrier.wait(timeout=30)
        answer = stores[i % 2].begin(record(f"run-{i}", key="shared"))
        if answer is None:
            inserted.append(i)
        answers[i] = answer

    threads = [threading.Thread(target=begin, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert len(inserted) == 1
    winner = f"run-{inserted[0]}"
    assert {a.run_id for a in answers if a is not None} == {winner}


class CountingProvider:
    """The offline extractive provider, counting the generations it was asked for."""

    def __init__(self) -> None:
        self.inner = ExtractiveProvider()
        self.calls = 0

    @property
    def kind(self) -> str:
        return self.inner.kind

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        self.calls += 1
        yield from self.inner.generate(request, cancel)


def test_a_completed_run_is_replayed_by_another_replica_without_new_generation(
    pg_dsn: str, pg_schema: str, local_embedding: LocalEmbedding
) -> None:
    def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        if request.operation == "index":
            return Grant("ns", {"otters": ANY_REVISION})
        return Grant("ns", {"otters": "r1"})

    closers: list[Callable[[], None]] = []

    def replica() -> tuple[RetrievalService, RunEngine, CountingProvider]:
        store = PgVectorStore.open(pg_dsn, schema=pg_schema)
        runs = PgRunStore.open(pg_dsn, schema=pg_schema)
        closers.extend([store.close, runs.close])
        service = RetrievalService([Corpus("docs", "v1", local_embedding, store, authorize)])
        provider = CountingProvider()
        return service, RunEngine(service, {"local": provider}, runs), provider

    try:
        (service, first, first_provider), (_, second, second_provider) = replica(), replica()
        alice = RequestContext("alice")
        service.index_context(
            IndexRequest(
                "docs",
                SourceInfo("otters", "r1", title="Otters"),
                [ChunkInput("otters-1", "Sea otters hold hands while they sleep.", Location(1))],
            ),
            alice,
        )
        request = RunRequest(
            provider="local",
            model="extractive",
            input="Why do otters hold hands?",
            retrieval=RunRetrieval(corpus="docs"),
            idempotency_key="replay-me",
        )
        original = first.run(request, alice)
        assert first_provider.calls == 1 and not original.replayed
        again = second.run(request, alice)
        assert again.replayed and (again.run_id, again.text) == (original.run_id, original.text)
        assert second_provider.calls == 0  # the replaying replica generated nothing
    finally:
        for close in closers:
            close()


def test_a_run_schema_of_the_previous_release_is_migrated_at_open(
    pg_dsn: str, pg_schema: str, run_stores: Callable[[], PgRunStore]
) -> None:
    # The run table exactly as the previous release created it (schema version 1).
    body = json.dumps(result_to_json(a_result("run-old")))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in pg_run_schema_statements(pg_schema, 1):
            conn.execute(statement)
        conn.execute(
            f'INSERT INTO "{pg_schema}".runs VALUES '
            "('run-old', 'alice', 'k1', 'fp-1', 'completed', 't', %s, NULL)",
            (body,),
        )
    store = run_stores()
    old = store.get("run-old")
    assert old is not None
    assert (old.result, old.provider, old.corpus) == (a_result("run-old"), None, None)
    replayed = store.begin(record("run-again"))
    assert replayed is not None and replayed.run_id == "run-old"
    fresh = RunRecord("run-new", "alice", "k2", "fp", "running", "t", provider="x", corpus="docs")
    assert store.begin(fresh) is None
    new = store.get("run-new")
    assert new is not None and (new.provider, new.corpus) == ("x", "docs")
    assert store.read_usage() == []  # the usage table came with the migration
    run_stores()  # a second open finds version 4 and changes nothing
    with psycopg.connect(pg_dsn) as conn:
        version = conn.execute(
            f"SELECT version FROM \"{pg_schema}\".schema_version WHERE component = 'run-store'"
        ).fetchone()
    assert version == (4,)


def test_results_the_previous_release_stored_read_back_identically_beside_new_ones(
    pg_dsn: str, pg_schema: str, run_stores: Callable[[], PgRunStore]
) -> None:
    store = run_stores()  # the table of schema version 2, as the previous release made it
    # The row exactly as the previous release wrote it: the public wire JSON of the result.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{pg_schema}".runs VALUES '
            "('run_old', 'alice', 'k1', 'fp-1', 'completed', 't', %s, NULL, 'local', 'docs')",
            (OLD_RESULT_JSON,),
        )
    old = store.get("run_old")
    assert old is not None and old.result == OLD_RESULT
    replayed = run_stores().begin(record("run-again"))
    assert replayed is not None and replayed.result == OLD_RESULT

    assert store.begin(record("run-new", key="k2")) is None
    store.complete("run-new", a_result("run-new"))
    new = run_stores().get("run-new")
    assert new is not None and new.result == a_result("run-new")
    with psycopg.connect(pg_dsn) as conn:
        query = f'SELECT run_id, result_json FROM "{pg_schema}".runs'
        rows = {str(k): str(v) for k, v in conn.execute(query).fetchall()}
    assert rows["run_old"] == OLD_RESULT_JSON  # read, never rewritten
    assert json.loads(rows["run-new"])["version"] == STORAGE_VERSION


def _usage(at: str, subject: str, tokens: int) -> UsageRecord:
    return UsageRecord(
        at, subject, "search", "embedding", "local-minilm", "local", "m", "d", 1, tokens
    )


def test_usage_records_are_kept_in_order_filtered_and_seen_by_every_replica(
    run_stores: Callable[[], PgRunStore], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = run_stores(), run_stores()
    records = [_usage("2026-01-01T00:00:02Z", "bob", 5), _usage("2026-01-01T00:00:01Z", "alice", 3)]
    first.record_usage(records)
    second.record_usage([_usage("2026-01-01T00:00:03Z", "alice", 4)])
    # Each replica commits its records in groups on its own thread: the other replica sees
    # them within one commit (its own reads wait for its own queue).
    wait_until(lambda: len(second.read_usage()) == 3, timeout=30, what="the first's records")
    assert [r.input_tokens for r in second.read_usage()] == [3, 5, 4]  # by time
    assert [r.input_tokens for r in first.read_usage(subject="alice")] == [3, 4]
    assert [r.subject for r in first.read_usage(since="2026-01-01T00:00:02Z")] == ["bob", "alice"]
    assert first.read_usage()[0] == records[1]
    # A sink that cannot write drops the records with a log line; it never fails the caller.
    first.close()
    first.record_usage([_usage("2026-01-01T00:00:04Z", "alice", 9)])
    assert "usage not recorded: 1 record(s) dropped" in caplog.text
    assert len(second.read_usage()) == 3


def test_prune_deletes_finished_runs_and_asked_for_usage_before_the_time(
    run_stores: Callable[[], PgRunStore],
) -> None:
    store, other = run_stores(), run_stores()
    for run_id, created in (
        ("old", "2026-01-01T00:00:00.000Z"),
        ("new", "2026-03-01T00:00:00.000Z"),
    ):
        assert (
            store.begin(RunRecord(run_id, "alice", f"k-{run_id}", "fp", "running", created)) is None
        )
        store.complete(run_id, a_result(run_id))
    going = RunRecord("going", "alice", "k-going", "fp", "running", "2025-06-01T00:00:00.000Z")
    assert store.begin(going) is None  # running, its lease renewed: kept whatever its age
    store.record_usage(
        [_usage("2026-01-02T00:00:00Z", "alice", 1), _usage("2026-03-02T00:00:00Z", "alice", 2)]
    )
    assert other.prune("2026-02-01T00:00:00.000Z") == (1, 0)  # from another replica
    assert store.get("old") is None
    assert store.get("new") is not None and store.get("going") is not None
    assert store.begin(RunRecord("again", "alice", "k-old", "fp", "running", "2026-03-05")) is None
    store.read_usage()  # this replica's queue written
    assert other.prune("2026-02-01T00:00:00.000Z", usage=True) == (0, 1)
    assert [u.input_tokens for u in other.read_usage()] == [2]


def test_a_report_s_open_neither_creates_nor_migrates_the_run_tables(
    pg_dsn: str, pg_schema: str, run_stores: Callable[[], PgRunStore]
) -> None:
    # `retrieval-host usage` and `runs prune` open with `migrate=False` (a black-box test:
    # a new release's report migrated the tables under an older host, which then could
    # not restart).
    def schema_exists() -> bool:
        with psycopg.connect(pg_dsn) as conn:
            query = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
            return conn.execute(query, (pg_schema,)).fetchone() is not None

    with pytest.raises(RetrievalError) as refused:
        PgRunStore.open(pg_dsn, schema=pg_schema, migrate=False)
    assert refused.value.reason == "schema-version" and "is not there yet" in str(refused.value)
    assert not schema_exists()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in pg_run_schema_statements(pg_schema, 3):
            conn.execute(statement)
    with pytest.raises(RetrievalError) as refused:
        PgRunStore.open(pg_dsn, schema=pg_schema, migrate=False)
    assert "has version 3" in str(refused.value)
    with psycopg.connect(pg_dsn) as conn:
        query = f"SELECT version FROM \"{pg_schema}\".schema_version WHERE component = 'run-store'"
        assert conn.execute(query).fetchone() == (3,)
    run_stores()  # the host's open migrates
    PgRunStore.open(pg_dsn, schema=pg_schema, migrate=False).close()


def test_a_report_on_another_application_s_schema_says_so(pg_dsn: str, pg_schema: str) -> None:
    # It said "not there yet: start the host", which the host then refused (a black-box test).
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'CREATE TABLE "{pg_schema}".orders (id int)')
    with pytest.raises(RetrievalError) as refused:
        PgRunStore.open(pg_dsn, schema=pg_schema, migrate=False)
    assert refused.value.reason == "unrelated-database"

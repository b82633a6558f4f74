"""Run records written by the previous release (schema 1) keep working, and who may read them."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs_model import (
    GenerationUsage,
    ManifestEntry,
    Receipt,
    RunResult,
    RunUsage,
)
from retrieval_host.http.auth import Principal
from retrieval_host.http.runs import may_read_run
from retrieval_host.wire.runs import result_to_json

# The run database exactly as the previous release created it (schema version 1).
V1_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    created_at TEXT NOT NULL,
    result_json TEXT,
    error_code TEXT,
    UNIQUE (subject, idempotency_key)
);
"""
V1_APPLICATION_ID = 0x52484E52


def a_result(run_id: str, corpus: str | None = "docs") -> RunResult:
    return RunResult(
        run_id=run_id,
        status="completed",
        provider="local",
        model="extractive",
        text="Otters sleep holding hands [source:a-1].",
        sources=[ManifestEntry("a-1", "a", "r1", Location(page=2, start_line=3, end_line=4))],
        receipts=[Receipt(1, "otters", "key", "2026-01-01T00:00:00.000Z", "ok", ["a-1"])],
        usage=RunUsage(GenerationUsage(1, 10, 5)),
        created_at="2026-01-01T00:00:00.000Z",
        completed_at="2026-01-01T00:00:01.000Z",
        corpus=corpus,
    )


def make_v1_database(path: Path) -> None:
    db = apsw.Connection(str(path))
    with db:
        db.execute(V1_SCHEMA)
        db.execute(f"PRAGMA application_id={V1_APPLICATION_ID}")
        db.execute("PRAGMA user_version=1")
        db.execute(
            "INSERT INTO runs VALUES (?, 'alice', 'k1', 'fp', 'completed', 't', ?, NULL)",
            ("run_done", json.dumps(result_to_json(a_result("run_done")))),
        )
        db.execute(
            "INSERT INTO runs VALUES ('run_failed', 'alice', 'k2', 'fp', 'failed', 't', NULL,"
            " 'PROVIDER_FAILED')"
        )
    db.close()


def principal(providers: tuple[str, ...], search: tuple[str, ...]) -> Principal:
    return Principal("alice", frozenset(providers), frozenset(search), frozenset(), frozenset())


def test_a_run_database_of_the_previous_release_opens_and_keeps_its_records(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    make_v1_database(path)
    store = SqliteRunStore.open(path)
    try:
        done = store.get("run_done")
        failed = store.get("run_failed")
        assert done is not None and failed is not None
        assert done.result == a_result("run_done")
        assert (done.provider, done.corpus) == (None, None)
        assert (failed.status, failed.error_code, failed.result) == (
            "failed",
            "PROVIDER_FAILED",
            None,
        )
        # New runs record what running them needed.
        fresh = RunRecord(
            "run_new", "alice", "k3", "fp", "running", "t", provider="local", corpus="docs"
        )
        assert store.begin(fresh) is None
        new = store.get("run_new")
        assert new is not None and (new.provider, new.corpus) == ("local", "docs")
        # The idempotency key of an old run still replays it.
        again = store.begin(RunRecord("run_other", "alice", "k1", "fp", "running", "t"))
        assert again is not None and again.run_id == "run_done"
    finally:
        store.close()
    version = apsw.Connection(str(path)).execute("PRAGMA user_version").fetchall()[0][0]
    assert version == 2
    # Opening the migrated file again is a no-op.
    SqliteRunStore.open(path).close()


def test_a_run_database_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    make_v1_database(path)
    db = apsw.Connection(str(path))
    db.execute("PRAGMA user_version=3")
    db.close()
    with pytest.raises(RetrievalError, match="version 3"):
        SqliteRunStore.open(path)


def test_reading_a_run_needs_its_provider_and_the_search_grant_of_its_corpus() -> None:
    recorded = RunRecord("r", "alice", None, "fp", "failed", "t", provider="fake", corpus="docs")
    assert may_read_run(principal(("fake",), ("docs",)), recorded)
    assert not may_read_run(principal((), ("docs",)), recorded)
    assert not may_read_run(principal(("fake",), ()), recorded)
    assert not may_read_run(principal(("local",), ("docs", "other")), recorded)
    # Without retrieval, the provider grant is all it needed.
    plain = RunRecord("r", "alice", None, "fp", "completed", "t", provider="fake")
    assert may_read_run(principal(("fake",), ()), plain)


def test_records_of_the_previous_release_are_judged_by_their_result_or_hidden() -> None:
    old_done = RunRecord("r", "alice", "k", "fp", "completed", "t", a_result("r"))
    assert may_read_run(principal(("local",), ("docs",)), old_done)
    assert not may_read_run(principal(("local",), ()), old_done)
    assert not may_read_run(principal((), ("docs",)), old_done)
    # An old failed run has no provider to check: no token reads it.
    old_failed = RunRecord("r", "alice", "k", "fp", "failed", "t", error_code="PROVIDER_FAILED")
    assert not may_read_run(principal(("local", "fake"), ("docs",)), old_failed)

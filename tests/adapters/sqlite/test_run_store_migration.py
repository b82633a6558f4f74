"""Run databases of earlier releases (schema versions 1 to 3) open, keep their records and
migrate; a database of a newer release is refused."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.usage import UsageRecord
from retrieval_host.serving.cli import main
from retrieval_host.wire.run_storage import STORAGE_VERSION
from retrieval_host.wire.runs import result_to_json
from tests.support.run_records import (
    OLD_PLAIN,
    OLD_PLAIN_JSON,
    OLD_RESULT,
    OLD_RESULT_JSON,
    SQLITE_RUNS_SCHEMA_V1,
    SQLITE_RUNS_SCHEMA_V2,
    SQLITE_RUNS_SCHEMA_V3,
    a_result,
    old_database,
)

USAGE = UsageRecord(
    "2026-12-02T10:00:00.000Z",
    "alice",
    "search",
    "embedding",
    "local-minilm",
    "local",
    "all-MiniLM-L6-v2-int8",
    "docs",
    1,
    7,
)


def make_v1_database(path: Path) -> None:
    old_database(
        path,
        SQLITE_RUNS_SCHEMA_V1,
        1,
        (
            "INSERT INTO runs VALUES (?, 'alice', 'k1', 'fp', 'completed', 't', ?, NULL)",
            ("run_done", json.dumps(result_to_json(a_result("run_done")))),
        ),
        (
            "INSERT INTO runs VALUES ('run_failed', 'alice', 'k2', 'fp', 'failed', 't', NULL,"
            " 'PROVIDER_FAILED')",
            (),
        ),
    )


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
    assert version == 4
    # Opening the migrated file again is a no-op.
    SqliteRunStore.open(path).close()


def test_a_run_database_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    make_v1_database(path)
    db = apsw.Connection(str(path))
    db.execute("PRAGMA user_version=5")
    db.close()
    with pytest.raises(RetrievalError, match="version 5"):
        SqliteRunStore.open(path)


def test_a_run_database_of_the_previous_release_reads_its_records_and_writes_the_new_format(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    old_database(
        path,
        SQLITE_RUNS_SCHEMA_V2,
        2,
        (
            "INSERT INTO runs VALUES ('run_old', 'alice', 'k1', 'fp', 'completed', 't', ?, NULL,"
            " 'local', 'docs')",
            (OLD_RESULT_JSON,),
        ),
        (
            "INSERT INTO runs VALUES ('run_plain', 'alice', 'k2', 'fp', 'completed', 't', ?,"
            " NULL, 'local', NULL)",
            (OLD_PLAIN_JSON,),
        ),
    )

    store = SqliteRunStore.open(path)
    try:
        old = store.get("run_old")
        assert old is not None and old.result == OLD_RESULT
        plain = store.get("run_plain")
        assert plain is not None and plain.result == OLD_PLAIN
        # The old record's key still replays it, with its old result.
        again = store.begin(RunRecord("run_again", "alice", "k1", "fp", "running", "t"))
        assert again is not None and again.result == OLD_RESULT
        # A new run is stored in the new format, beside the old records.
        new_result = replace(OLD_RESULT, run_id="run_new")
        assert store.begin(RunRecord("run_new", "alice", "k3", "fp", "running", "t")) is None
        store.complete("run_new", new_result)
        new = store.get("run_new")
        assert new is not None and new.result == new_result
        # The usage table arrives empty with the migration and takes records.
        assert store.read_usage() == []
        store.record_usage([USAGE])
        assert store.read_usage() == [USAGE]
    finally:
        store.close()
    query = "SELECT run_id, result_json FROM runs"
    rows = {str(k): str(v) for k, v in apsw.Connection(str(path)).execute(query).fetchall()}
    assert rows["run_old"] == OLD_RESULT_JSON  # old records are read, never rewritten
    assert json.loads(rows["run_new"])["version"] == STORAGE_VERSION


def test_a_closed_run_store_drops_usage_records_with_a_log_line_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_path.chmod(0o700)
    store = SqliteRunStore.open(tmp_path / "runs.db")
    store.record_usage([USAGE])
    store.close()
    store.record_usage([USAGE, USAGE])
    assert "usage not recorded: 2 record(s) dropped" in caplog.text
    reopened = SqliteRunStore.open(tmp_path / "runs.db")
    try:
        assert reopened.read_usage() == [USAGE]
    finally:
        reopened.close()


def test_a_run_database_of_the_previous_main_gets_leases_for_new_runs_only(
    tmp_path: Path,
) -> None:
    """Version 3 had no leases: its running record (a run of the old release, perhaps still
    going on another host during an upgrade) is never marked interrupted; new runs get a
    lease that lapses."""
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    old_database(
        path,
        SQLITE_RUNS_SCHEMA_V3,
        3,
        (
            "INSERT INTO runs VALUES ('run_old', 'alice', 'k1', 'fp', 'running', 't', NULL, NULL,"
            " 'local', 'docs')",
            (),
        ),
        (
            "INSERT INTO usage VALUES (1, '2026-12-01T00:00:00.000Z', 'alice', 'run',"
            " 'generation', 'local', NULL, 'm', NULL, 1, 2, 3, 0, 'run_old')",
            (),
        ),
    )
    store = SqliteRunStore.open(path, lease_s=1.0)
    try:
        assert len(store.read_usage()) == 1
        assert store.begin(RunRecord("run_new", "alice", "k2", "fp", "running", "t")) is None
    finally:
        store.close()  # ends run_new as interrupted, as a host stopping mid-run does
    reopened = SqliteRunStore.open(path)
    try:
        old, new = reopened.get("run_old"), reopened.get("run_new")
        assert old is not None and (old.status, old.error_code) == ("running", None)
        assert new is not None and (new.status, new.error_code) == ("failed", "INTERRUPTED")
    finally:
        reopened.close()
    query = "SELECT run_id, lease_until FROM runs ORDER BY run_id"
    leases = {str(k): v for k, v in apsw.Connection(str(path)).execute(query).fetchall()}
    assert leases["run_old"] is None and isinstance(leases["run_new"], float)
    assert apsw.Connection(str(path)).execute("PRAGMA user_version").fetchall()[0][0] == 4


def test_the_report_commands_never_migrate_the_run_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box test: `retrieval-host usage` (and `runs prune`) of a new release migrated
    # the run database under the older host serving it, which then could not restart.
    store_dir = tmp_path / "store"
    store_dir.mkdir(mode=0o700)
    path = store_dir / "runs.db"
    old_database(path, SQLITE_RUNS_SCHEMA_V3, 3)
    config = tmp_path / "host.json"
    config.write_text(
        json.dumps(
            {
                "tls": {"certFile": "c.pem", "keyFile": "k.pem"},
                "store": {"sqlitePath": str(store_dir / "retrieval.sqlite")},
            }
        )
    )
    for argv in (["usage"], ["runs", "prune", "--before", "2026-02-01"]):
        assert main([*argv, "--config", str(config)], environ={}) == 2
        said = capsys.readouterr().err
        assert "schema version 3" in said and "start the host of this release first" in said
        assert apsw.Connection(str(path)).execute("PRAGMA user_version").fetchall() == [(3,)]
    with pytest.raises(RetrievalError) as refused:
        SqliteRunStore.open(path, migrate=False)
    assert refused.value.code == "UNSAFE_STORE" and refused.value.reason == "schema-version"
    with caplog.at_level(logging.INFO, logger="retrieval_host.adapters.sqlite.schema"):
        SqliteRunStore.open(path).close()  # the host's open migrates it, and says so
    assert [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()] == [
        f"migrated the run store at {path} from schema version 3 to 4 (an earlier release "
        "can no longer open it)"
    ]
    assert main(["usage", "--config", str(config)], environ={}) == 0

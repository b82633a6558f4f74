"""Run records for the run storage and run store tests: a result builder, and results and run
databases exactly as earlier releases stored them.

The previous release stored a result as its public wire JSON with no version field
(`wire/run_storage.py` calls this storage version 1): `OLD_RESULT_JSON` and `OLD_PLAIN_JSON`.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from retrieval_host.core.models import EmbeddingUsage, Location
from retrieval_host.core.runs_model import (
    GenerationUsage,
    ManifestEntry,
    OutputArtifact,
    Receipt,
    RunResult,
    RunUsage,
)

# `result_json` exactly as the previous release wrote it (its `json.dumps(result_to_json(r),
# separators=(",", ":"))`), for `OLD_RESULT`. A literal on purpose: it must not follow the
# public wire if that changes.
OLD_RESULT_JSON = (
    '{"runId":"run_old","status":"completed","provider":"local","model":"extractive",'
    '"text":"Otters \\u201csleep\\u201d holding hands [source:a-1] [source:b-2].",'
    '"sources":[{"id":"a-1","origin":"retrieval","source":{"id":"a","revision":"r1"},'
    '"title":"Otters","location":{"page":2,"startLine":3,"endLine":4}},'
    '{"id":"b-2","origin":"retrieval","source":{"id":"b","revision":"r7"},"title":"",'
    '"location":{"documentId":"mail-9"}}],'
    '"receipts":[{"sequence":1,"query":"otters","key":"k1",'
    '"startedAt":"2026-01-01T00:00:00.000Z","status":"ok","sourceIds":["a-1"],'
    '"errorCode":null},{"sequence":2,"query":"sleep","key":"k2",'
    '"startedAt":"2026-01-01T00:00:00.500Z","status":"failed","sourceIds":[],'
    '"errorCode":"PERMISSION_DENIED"},{"sequence":3,"query":"otters","key":"k1",'
    '"startedAt":"2026-01-01T00:00:00.600Z","status":"duplicate","sourceIds":[],'
    '"errorCode":null}],'
    '"usage":{"generation":{"requests":2,"inputTokens":10,"outputTokens":5},'
    '"embedding":{"requests":1,"inputTokens":7}},'
    '"artifact":{"name":"answer.md","mediaType":"text/markdown","sourceIds":["a-1"]},'
    '"corpus":"docs","createdAt":"2026-01-01T00:00:00.000Z",'
    '"completedAt":"2026-01-01T00:00:01.000Z","replayed":false}'
)
OLD_PLAIN_JSON = (
    '{"runId":"run_plain","status":"completed","provider":"local","model":"extractive",'
    '"text":"Hi.","sources":[],"receipts":[],"usage":{"generation":{"requests":0,'
    '"inputTokens":0,"outputTokens":0},"embedding":{"requests":0,"inputTokens":0}},'
    '"artifact":null,"corpus":null,"createdAt":"t0","completedAt":"t1","replayed":false}'
)
OLD_RESULT = RunResult(
    run_id="run_old",
    status="completed",
    provider="local",
    model="extractive",
    text="Otters \u201csleep\u201d holding hands [source:a-1] [source:b-2].",
    sources=[
        ManifestEntry("a-1", "a", "r1", Location(page=2, start_line=3, end_line=4), "Otters"),
        ManifestEntry("b-2", "b", "r7", Location(document_id="mail-9")),
    ],
    receipts=[
        Receipt(1, "otters", "k1", "2026-01-01T00:00:00.000Z", "ok", ["a-1"]),
        Receipt(2, "sleep", "k2", "2026-01-01T00:00:00.500Z", "failed", [], "PERMISSION_DENIED"),
        Receipt(3, "otters", "k1", "2026-01-01T00:00:00.600Z", "duplicate", []),
    ],
    usage=RunUsage(GenerationUsage(2, 10, 5), EmbeddingUsage(1, 7)),
    created_at="2026-01-01T00:00:00.000Z",
    completed_at="2026-01-01T00:00:01.000Z",
    artifact=OutputArtifact("answer.md", "text/markdown", ["a-1"]),
    corpus="docs",
)
OLD_PLAIN = RunResult(
    "run_plain", "completed", "local", "extractive", "Hi.", [], [], RunUsage(), "t0", "t1"
)


def a_result(run_id: str, corpus: str | None = "docs") -> RunResult:
    """A completed result with one cited source and one receipt."""
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


# The SQLite run database exactly as earlier releases created it: schema version 1, then
# version 2 (which added the provider and corpus a run needs to be read again), then 3.
SQLITE_RUNS_APPLICATION_ID = 0x52484E52
_V1_COLUMNS = """\
    run_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    created_at TEXT NOT NULL,
    result_json TEXT,
    error_code TEXT,
"""
_V2_COLUMNS = """\
    provider TEXT,
    corpus TEXT,
"""
_UNIQUE_KEY = "    UNIQUE (subject, idempotency_key)\n"
SQLITE_RUNS_SCHEMA_V1 = f"CREATE TABLE runs (\n{_V1_COLUMNS}{_UNIQUE_KEY});\n"
SQLITE_RUNS_SCHEMA_V2 = f"CREATE TABLE runs (\n{_V1_COLUMNS}{_V2_COLUMNS}{_UNIQUE_KEY});\n"
# Version 3 (the previous main) added the usage log; version 4 the runs' leases.
SQLITE_RUNS_SCHEMA_V3 = (
    SQLITE_RUNS_SCHEMA_V2
    + """CREATE TABLE usage (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    subject TEXT NOT NULL,
    operation TEXT NOT NULL,
    kind TEXT NOT NULL,
    provider TEXT NOT NULL,
    account TEXT,
    model TEXT NOT NULL,
    corpus TEXT,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    documents INTEGER NOT NULL,
    run_id TEXT
);
CREATE INDEX usage_at ON usage (at);
"""
)


# The PostgreSQL run tables as earlier releases created them: `run-store` version 1, and 3
# (the previous main: provider and corpus columns, and the usage log).
_PG_RUNS_V1 = """\
    run_id text PRIMARY KEY,
    subject text NOT NULL,
    idempotency_key text,
    fingerprint text NOT NULL,
    status text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    created_at text NOT NULL,
    result_json text,
    error_code text,
"""
_PG_RUNS_V3 = _PG_RUNS_V1 + "    provider text,\n    corpus text,\n"
_PG_USAGE = """CREATE TABLE {s}.usage (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at text NOT NULL,
    subject text NOT NULL,
    operation text NOT NULL,
    kind text NOT NULL,
    provider text NOT NULL,
    account text,
    model text NOT NULL,
    corpus text,
    requests bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    documents bigint NOT NULL,
    run_id text
)"""


def pg_run_schema_statements(schema: str, version: int) -> list[str]:
    """The statements that made `schema` as the release of run-store `version` (1 or 3)."""
    s = f'"{schema}"'
    columns = {1: _PG_RUNS_V1, 3: _PG_RUNS_V3}[version]
    statements = [
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {s}.schema_version (component text PRIMARY KEY, version integer NOT NULL)",
        f"INSERT INTO {s}.schema_version VALUES ('run-store', {version})",
        f"CREATE TABLE {s}.runs (\n{columns}"
        "    CONSTRAINT runs_idempotency_key UNIQUE (subject, idempotency_key)\n)",
    ]
    if version == 3:
        statements += [_PG_USAGE.format(s=s), f"CREATE INDEX usage_at ON {s}.usage (at)"]
    return statements


def old_database(
    path: Path, schema: str, version: int, *rows: tuple[str, tuple[object, ...]]
) -> None:
    """A run database as the release of schema `version` left it, holding `rows` (each an
    INSERT statement and its values)."""
    db = apsw.Connection(str(path))
    with db:
        db.execute(schema)
        db.execute(f"PRAGMA application_id={SQLITE_RUNS_APPLICATION_ID}")
        db.execute(f"PRAGMA user_version={version}")
        for statement, values in rows:
            db.execute(statement, values)
    db.close()


def forget_finish_reason(runs_db: Path, run_id: str) -> None:
    """The run's stored result as a release before `finish_reason` wrote it (storage version
    2 without the key: `wire/run_storage.py`), edited in place in the host's runs database.
    The run must have completed, its answer ended `stop`; it is asserted at once, not polled
    for: the host commits a run's record before it answers.

    Through apsw, the host's own SQLite, never stdlib `sqlite3`: with a host in this process,
    that links a second copy of SQLite whose locks the host's cannot see (POSIX locks are per
    process: "How To Corrupt An SQLite Database File", 2.2.1). Its connection, closed whenever
    the garbage collector got to it, took itself for the last one, checkpointed the WAL and
    unlinked it under the host: the host's later commits went to the unlinked log, and a record
    read after its answer had arrived held no result or was missing (session 43)."""
    db = apsw.Connection(str(runs_db))
    try:
        db.set_busy_timeout(30_000)
        db.execute(
            "UPDATE runs SET result_json = json_remove(result_json, '$.finish_reason') "
            "WHERE run_id = ? AND json_extract(result_json, '$.finish_reason') = 'stop'",
            (run_id,),
        )
        assert db.changes() == 1
    finally:
        db.close()

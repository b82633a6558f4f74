"""Run results are stored in a versioned format of their own, and the previous release's
records (the public wire JSON, no version) read back identically."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs_model import RunResult
from retrieval_host.wire.run_storage import STORAGE_VERSION, decode_result, encode_result
from retrieval_host.wire.runs import result_to_json
from tests.support.old_run_records import OLD_PLAIN, OLD_PLAIN_JSON, OLD_RESULT, OLD_RESULT_JSON

# The run database exactly as the previous release created it (schema version 2).
PREVIOUS_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    created_at TEXT NOT NULL,
    result_json TEXT,
    error_code TEXT,
    provider TEXT,
    corpus TEXT,
    UNIQUE (subject, idempotency_key)
);
"""


def test_the_previous_release_records_read_back_identically() -> None:
    assert decode_result(OLD_RESULT_JSON) == OLD_RESULT
    assert decode_result(OLD_PLAIN_JSON) == OLD_PLAIN


def test_the_literal_old_records_are_what_the_previous_release_wrote() -> None:
    # Holds while the public wire of a result is unchanged; if the wire changes, this test
    # changes and the literals above stay (they are the old records).
    for result, stored in ((OLD_RESULT, OLD_RESULT_JSON), (OLD_PLAIN, OLD_PLAIN_JSON)):
        assert json.dumps(result_to_json(result), separators=(",", ":")) == stored


def test_a_stored_result_names_its_format_and_version_and_is_not_the_wire_json() -> None:
    stored = json.loads(encode_result(OLD_RESULT))
    assert (stored["format"], stored["version"]) == ("retrieval-host/run-result", 2)
    assert STORAGE_VERSION == 2
    assert "runId" not in stored and stored["run_id"] == "run_old"
    assert stored != result_to_json(OLD_RESULT)


@pytest.mark.parametrize("result", [OLD_RESULT, OLD_PLAIN])
def test_a_stored_result_reads_back_equal(result: RunResult) -> None:
    assert decode_result(encode_result(result)) == result
    replayed = replace(result, replayed=True)
    assert decode_result(encode_result(replayed)) == replayed


def test_a_record_of_a_later_storage_version_is_refused() -> None:
    later = json.loads(encode_result(OLD_RESULT))
    later["version"] = STORAGE_VERSION + 1
    with pytest.raises(RetrievalError) as caught:
        decode_result(json.dumps(later))
    assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
    assert caught.value.reason == "record-version"
    assert "version 3" in caught.value.detail


def test_a_run_database_of_the_previous_release_reads_its_records_and_writes_the_new_format(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "runs.db"
    db = apsw.Connection(str(path))
    with db:
        db.execute(PREVIOUS_SCHEMA)
        db.execute(f"PRAGMA application_id={0x52484E52}")
        db.execute("PRAGMA user_version=2")
        db.execute(
            "INSERT INTO runs VALUES ('run_old', 'alice', 'k1', 'fp', 'completed', 't', ?, NULL,"
            " 'local', 'docs')",
            (OLD_RESULT_JSON,),
        )
        db.execute(
            "INSERT INTO runs VALUES ('run_plain', 'alice', 'k2', 'fp', 'completed', 't', ?,"
            " NULL, 'local', NULL)",
            (OLD_PLAIN_JSON,),
        )
    db.close()

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
    finally:
        store.close()
    query = "SELECT run_id, result_json FROM runs"
    rows = {str(k): str(v) for k, v in apsw.Connection(str(path)).execute(query).fetchall()}
    assert rows["run_old"] == OLD_RESULT_JSON  # old records are read, never rewritten
    assert json.loads(rows["run_new"])["version"] == STORAGE_VERSION

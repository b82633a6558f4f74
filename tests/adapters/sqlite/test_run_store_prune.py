"""Expiring run and usage records (`retrieval-host runs prune`): what goes, what stays, and
that the pruned answers' text does not stay in the file's free pages."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.adapters.sqlite import schema as sqlite_schema
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.usage import UsageRecord
from retrieval_host.serving.cli import main
from tests.support.run_records import a_result

SECRET = "walrus-erasure-marker-7f3a"  # in the pruned answer only


def _record(run_id: str, created_at: str, key: str) -> RunRecord:
    return RunRecord(run_id, "alice", key, "fp-1", "running", created_at)


def _usage(at: str) -> UsageRecord:
    return UsageRecord(at, "alice", "search", "embedding", "local-minilm", "local", "m", "d", 1, 3)


def _fill(store: SqliteRunStore) -> None:
    for run_id, created in (
        ("old", "2026-01-01T00:00:00.000Z"),
        ("new", "2026-03-01T00:00:00.000Z"),
    ):
        assert store.begin(_record(run_id, created, f"key-{run_id}")) is None
        result = dataclasses.replace(
            a_result(run_id), text=f"{SECRET if run_id == 'old' else 'kept'} [source:a-1]."
        )
        store.complete(run_id, result)
    # Still running (its lease renewed by this store): kept whatever its age.
    assert store.begin(_record("going", "2025-06-01T00:00:00.000Z", "key-going")) is None
    store.record_usage([_usage("2026-01-02T00:00:00.000Z"), _usage("2026-03-02T00:00:00.000Z")])


def test_prune_deletes_finished_runs_before_the_time_and_their_text(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SqliteRunStore.open(path)
    _fill(store)
    assert store.prune("2026-02-01T00:00:00.000Z") == (1, 0)
    assert store.get("old") is None
    assert store.get("new") is not None and store.get("going") is not None
    # Its idempotency key is free again: used anew, it starts another run.
    assert store.begin(_record("again", "2026-03-05T00:00:00.000Z", "key-old")) is None
    assert len(store.read_usage()) == 2  # usage stays unless asked
    assert store.prune("2026-02-01T00:00:00.000Z", usage=True) == (0, 1)
    assert [u.at for u in store.read_usage()] == ["2026-03-02T00:00:00.000Z"]
    store.close()
    held = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("runs.db"))
    assert b"kept [source:a-1]" in held  # the file does hold answers as text
    assert SECRET.encode() not in held  # not in free pages, nor in the write-ahead log


def test_the_command_prunes_beside_the_configuration_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    config = tmp_path / "host.json"
    config.write_text(
        json.dumps(
            {
                "tls": {"certFile": "c.pem", "keyFile": "k.pem"},
                "store": {"sqlitePath": str(store_dir / "retrieval.sqlite")},
            }
        )
    )
    argv = ["runs", "prune", "--config", str(config), "--before", "2026-02-01"]
    assert main(argv, environ={}) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not store_dir.exists()
    store_dir.mkdir(mode=0o700)
    store = SqliteRunStore.open(store_dir / "runs.db")
    _fill(store)
    store.close()  # the running one is marked interrupted at close: no lease renews it now
    assert main([*argv, "--usage"], environ={}) == 0
    said = capsys.readouterr().out
    assert (
        said
        == "deleted 2 run record(s) and 1 usage record(s) from before 2026-02-01T00:00:00.000Z\n"
    )
    with pytest.raises(SystemExit) as refused:  # argparse's usage error
        main(["runs", "prune", "--config", str(config), "--before", "yesterday"], environ={})
    assert refused.value.code == 2
    assert "not an RFC 3339 time" in capsys.readouterr().err


def _fill_many(store: SqliteRunStore, count: int) -> None:
    for n in range(count):
        run_id = f"old-{n}"
        assert store.begin(_record(run_id, "2026-01-01T00:00:00.000Z", f"key-{n}")) is None
        store.complete(
            run_id, dataclasses.replace(a_result(run_id), text=f"{'x' * 4000} {n} [source:a-1].")
        )


def test_prune_with_vacuum_gives_the_space_back_and_without_keeps_the_file(
    tmp_path: Path,
) -> None:
    """Probe "soak" (session 44): pruned runs left runs.db at its size (11.8 MB for 0.3 MB of
    records) and the README named no command that shrinks it."""
    sizes: dict[bool, tuple[int, int]] = {}
    for vacuum in (False, True):
        path = tmp_path / f"runs-{vacuum}.db"
        store = SqliteRunStore.open(path)
        _fill_many(store, 300)
        full = path.stat().st_size
        assert store.prune("2026-02-01T00:00:00.000Z", vacuum=vacuum) == (300, 0)
        sizes[vacuum] = (full, path.stat().st_size)
        assert store.get("old-0") is None
        # Still a working store: a new run is recorded and read back.
        assert store.begin(_record("after", "2026-03-01T00:00:00.000Z", "key-after")) is None
        assert store.get("after") is not None
        store.close()
    # After the prune's checkpoint the file holds every page the 300 answers of ~4 KB took:
    # kept without VACUUM, given back with it.
    (_, kept), (_, shrunk) = sizes[False], sizes[True]
    assert kept > 1_000_000
    assert shrunk < kept / 10


def test_the_command_vacuums_on_request_and_refuses_it_for_postgres(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir(mode=0o700)
    config = tmp_path / "host.json"
    tls = {"certFile": "c.pem", "keyFile": "k.pem"}
    config.write_text(
        json.dumps({"tls": tls, "store": {"sqlitePath": str(store_dir / "retrieval.sqlite")}})
    )
    store = SqliteRunStore.open(store_dir / "runs.db")
    _fill_many(store, 300)
    store.close()
    argv = ["runs", "prune", "--config", str(config), "--before", "2026-02-01", "--vacuum"]
    assert main(argv, environ={}) == 0
    said = capsys.readouterr().out.splitlines()
    size = (store_dir / "runs.db").stat().st_size
    assert said == [
        "deleted 300 run record(s) from before 2026-02-01T00:00:00.000Z",
        f"{store_dir / 'runs.db'} is now {size:,} bytes",
    ]
    assert size < 200_000  # 300 answers of ~4 KB took more than 1.2 MB
    postgres = tmp_path / "pg.json"
    postgres.write_text(json.dumps({"tls": tls, "store": {"postgresDsn": {"env": "PG_DSN"}}}))
    argv[3] = str(postgres)
    # Refused before any connection (nothing listens on port 1).
    assert main(argv, environ={"PG_DSN": "postgresql://u@127.0.0.1:1/db"}) == 2
    assert "--vacuum shrinks the SQLite run store" in capsys.readouterr().err


def test_vacuum_beside_a_reader_says_the_file_shrinks_at_the_hosts_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review V (session 44): with a serving host reading, the checkpoint after VACUUM is busy
    and the command printed the old size as the new one, beside a log of the whole copy."""
    # The checkpoints wait for the reader this long (the host's 10 s), then give up.
    monkeypatch.setattr(sqlite_schema, "BUSY_TIMEOUT_MS", 200)
    store_dir = tmp_path / "store"
    store_dir.mkdir(mode=0o700)
    config = tmp_path / "host.json"
    config.write_text(
        json.dumps(
            {
                "tls": {"certFile": "c.pem", "keyFile": "k.pem"},
                "store": {"sqlitePath": str(store_dir / "retrieval.sqlite")},
            }
        )
    )
    store = SqliteRunStore.open(store_dir / "runs.db")
    _fill_many(store, 300)
    store.close()
    reader = apsw.Connection(str(store_dir / "runs.db"))  # a host's read, held throughout
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM runs").fetchall() == [(300,)]
    argv = ["runs", "prune", "--config", str(config), "--before", "2026-02-01", "--vacuum"]
    try:
        assert main(argv, environ={}) == 0
    finally:
        reader.execute("COMMIT")
        reader.close()
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "deleted 300 run record(s) from before 2026-02-01T00:00:00.000Z"
    assert said[2].startswith("  its write-ahead log still holds ")
    assert said[2].endswith(" bytes: the file shrinks at the host's next checkpoint")

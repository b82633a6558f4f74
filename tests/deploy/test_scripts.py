"""The scripts the image ships (health check, SQLite backup) and deploy/check-image."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite import tables
from retrieval_host.adapters.sqlite.run_store import SqliteRunStore
from retrieval_host.settings import HostSettings, LimitSettings, ListenSettings, TlsSettings
from tests.adapters.sqlite.test_snapshot_restore import open_store, write
from tests.support.deploy import DEPLOY, k8s_object, yaml_documents
from tests.support.host import RunningHost, TlsFiles, make_tls, serve_in_thread

HEALTHCHECK = DEPLOY / "scripts" / "healthcheck.py"
BACKUP = DEPLOY / "scripts" / "sqlite_backup.py"


def run_script(
    script: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # -I as in the image's HEALTHCHECK: no user site, no PYTHON* variables.
    return subprocess.run(
        [sys.executable, "-I", str(script), *args],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def host(tls: TlsFiles) -> Iterator[RunningHost]:
    # No application: /healthz and /readyz are served without a driver (no model to load).
    settings = HostSettings(
        listen=ListenSettings(host="127.0.0.1", port=0),
        tls=TlsSettings(cert_file=tls.cert_file, key_file=tls.key_file),
    )
    with serve_in_thread(settings, None, tls) as running:
        yield running


def test_healthcheck_verifies_the_host_against_the_configured_ca(
    host: RunningHost, tls: TlsFiles
) -> None:
    result = run_script(
        HEALTHCHECK,
        env={
            "HEALTHCHECK_URL": f"{host.base_url}/healthz",
            "HEALTHCHECK_CA_FILE": str(tls.ca_file),
        },
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


def test_healthcheck_without_a_ca_skips_verification_on_loopback_only(host: RunningHost) -> None:
    result = run_script(HEALTHCHECK, env={"HEALTHCHECK_URL": f"{host.base_url}/healthz"})
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr

    remote = run_script(HEALTHCHECK, env={"HEALTHCHECK_URL": "https://example.invalid/healthz"})
    assert remote.returncode == 1
    assert "not a loopback address" in remote.stderr


def test_healthcheck_fails_on_a_certificate_for_another_name(
    host: RunningHost, tls: TlsFiles
) -> None:
    result = run_script(
        HEALTHCHECK,
        env={
            "HEALTHCHECK_URL": f"{host.base_url}/healthz",
            "HEALTHCHECK_CA_FILE": str(tls.ca_file),
            "HEALTHCHECK_SERVER_NAME": "retrieval-host.example.com",
        },
    )
    assert result.returncode == 1
    assert "certificate verify failed" in result.stderr


def test_healthcheck_fails_on_a_non_health_path_and_a_closed_port(host: RunningHost) -> None:
    wrong = run_script(HEALTHCHECK, env={"HEALTHCHECK_URL": f"{host.base_url}/nowhere"})
    assert wrong.returncode == 1
    assert "HTTP 404" in wrong.stderr

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    closed = run_script(
        HEALTHCHECK, env={"HEALTHCHECK_URL": f"https://127.0.0.1:{closed_port}/healthz"}
    )
    assert closed.returncode == 1
    assert "unhealthy" in closed.stderr


def _rows(path: Path) -> int:
    connection = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        (count,) = connection.execute("SELECT count(*) FROM t").fetchone() or (0,)
        return int(count)
    finally:
        connection.close()


def test_backup_copies_what_is_committed_in_the_wal_of_a_live_database(tmp_path: Path) -> None:
    live = tmp_path / "retrieval.sqlite"
    writer = apsw.Connection(str(live))
    try:
        writer.execute("PRAGMA journal_mode=WAL").fetchall()
        writer.execute("PRAGMA wal_autocheckpoint=0").fetchall()
        writer.execute("CREATE TABLE t(x TEXT)")
        with writer:
            writer.executemany("INSERT INTO t VALUES (?)", [(f"row {i}",) for i in range(500)])
        # A file copy of the database alone misses what is still in the -wal.
        copied = tmp_path / "cp-copy.sqlite"
        shutil.copyfile(live, copied)
        assert Path(f"{live}-wal").stat().st_size > 0

        backup = tmp_path / "backups" / "retrieval.sqlite"
        backup.parent.mkdir()
        result = run_script(BACKUP, str(live), str(backup))
        assert result.returncode == 0, result.stderr
        assert "integrity ok" in result.stdout
        with writer:  # the host keeps writing during and after the backup
            writer.execute("INSERT INTO t VALUES ('later')")
    finally:
        writer.close()
    assert _rows(backup) == 500
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert sorted(p.name for p in backup.parent.iterdir()) == ["retrieval.sqlite"]
    with pytest.raises(apsw.SQLError):
        _rows(copied)


def test_backup_of_a_missing_database_fails_and_writes_nothing(tmp_path: Path) -> None:
    result = run_script(BACKUP, str(tmp_path / "typo.sqlite"), str(tmp_path / "out.sqlite"))
    assert result.returncode == 1
    assert "is not a file" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_backup_refuses_a_destination_that_is_the_live_database_or_not_a_backup(
    tmp_path: Path,
) -> None:
    # A black-box test: DEST = SOURCE replaced the live database under a running host.
    live = tmp_path / "store" / "retrieval.sqlite"
    live.parent.mkdir()
    writer = apsw.Connection(str(live))
    try:
        writer.execute("PRAGMA journal_mode=WAL").fetchall()
        writer.execute("CREATE TABLE t(x TEXT)")
        with writer:
            writer.execute("INSERT INTO t VALUES ('kept')")
        config = tmp_path / "host.json"
        config.write_text('{"listen": {}}\n')
        runs = live.with_name("runs.db")  # another live database: a typo for the backup
        other = apsw.Connection(str(runs))
        other.execute("PRAGMA journal_mode=WAL").fetchall()
        other.execute("CREATE TABLE r(x TEXT)")
        before = {p: p.read_bytes() for p in (live, config, runs)}
        for dest, words in (
            (live, "is the live database"),
            (tmp_path / "store" / ".." / "store" / "retrieval.sqlite", "is the live database"),
            (Path(f"{live}-wal"), "is the live database"),
            (config, "is not a SQLite backup"),
            (tmp_path / "missing" / "b.sqlite", "does not exist"),
            (runs, "is a database in use"),
            (tmp_path, "is a directory: name the backup file"),
        ):
            result = run_script(BACKUP, str(live), str(dest))
            assert result.returncode == 1 and words in result.stderr, (dest, result.stderr)
            assert "Traceback" not in result.stderr
        assert {p: p.read_bytes() for p in before} == before
        not_sqlite = run_script(BACKUP, str(config), str(tmp_path / "b.sqlite"))
        assert not_sqlite.returncode == 1 and "is not a SQLite database" in not_sqlite.stderr
        first = tmp_path / "b.sqlite"
        for _ in range(2):  # an earlier backup is replaced
            assert run_script(BACKUP, str(live), str(first)).returncode == 0
        assert _rows(first) == 1
        other.close()
    finally:
        writer.close()


def _files(*folders: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for folder in folders for p in sorted(folder.iterdir())}


def _set_user_version(path: Path, version: int) -> None:
    connection = apsw.Connection(str(path))
    try:
        connection.execute(f"PRAGMA user_version={version}")
    finally:
        connection.close()


@pytest.fixture
def stopped_host(tmp_path: Path) -> dict[str, Path]:
    """Probe F1's scene: a host's two databases after it ran and stopped (its index snapshots
    beside `retrieval.sqlite`, no -wal or -shm left), a copy of that store as a second host's,
    and backups of both databases, one as a later release (newer schema version) took it."""
    tmp_path.chmod(0o700)
    store_dir = tmp_path / "store"
    store_dir.mkdir(mode=0o700)
    index, runs = store_dir / "retrieval.sqlite", store_dir / "runs.db"
    with open_store(index) as store:
        write(store, "s1", ["the only passage"])
    SqliteRunStore.open(runs).close()
    assert [p for p in store_dir.iterdir() if "-index-" in p.name]
    assert not [p for p in store_dir.iterdir() if p.name.endswith(("-wal", "-shm"))]
    other_host = shutil.copytree(store_dir, tmp_path / "other-host") / index.name
    backups = tmp_path / "backups"
    backups.mkdir()
    paths = {
        "index": index,
        "runs": runs,
        "other host's index": other_host,
        "index backup": backups / "index.sqlite",
        "runs backup": backups / "runs.db",
        "newer index backup": backups / "newer.sqlite",
        "older index backup": backups / "older.sqlite",
    }
    for source, dest in (("index", "index backup"), ("runs", "runs backup")):
        assert run_script(BACKUP, str(paths[source]), str(paths[dest])).returncode == 0
    for name, version in (
        ("newer", tables.SCHEMA_VERSION + 1),
        ("older", tables.SCHEMA_VERSION - 1),
    ):
        shutil.copyfile(paths["index backup"], paths[f"{name} index backup"])
        _set_user_version(paths[f"{name} index backup"], version)
    return paths


@pytest.mark.parametrize(
    ("source", "dest", "words"),
    [
        ("runs", "index", "is a host's store (it has retrieval.sqlite-index-* beside it)"),
        ("index", "other host's index", "is a host's store (it has retrieval.sqlite-index-*"),
        ("index", "runs", "is another kind of database (application_id 0x52484e52"),
        ("runs", "index backup", "is another kind of database (application_id 0x52485653"),
        ("index", "runs backup", "is another kind of database (application_id 0x52484e52"),
        ("index", "newer index backup", f"newer schema (user_version {tables.SCHEMA_VERSION + 1})"),
    ],
    ids=[
        "probe-f1",
        "another-host",
        "index-onto-runs",
        "runs-onto-index-backup",
        "index-onto-runs-backup",
        "newer-schema",
    ],
)
def test_backup_refuses_to_replace_a_database_that_is_not_an_earlier_backup_of_the_source(
    stopped_host: dict[str, Path], source: str, dest: str, words: str
) -> None:
    """Probe F1, session 43: with the host stopped, `runs.db` backed up onto `retrieval.sqlite`
    replaced the index ("integrity ok", exit 0) and the host no longer started. DEST is
    replaced only by a backup of the same kind of database (its application_id) with a schema
    no newer than the source's, and never where a host keeps its index snapshots."""
    folders = {p.parent for p in stopped_host.values()}
    before = _files(*folders)
    result = run_script(BACKUP, str(stopped_host[source]), str(stopped_host[dest]))
    assert result.returncode == 1 and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert _files(*folders) == before  # byte for byte, and nothing added or left behind


def test_backup_replaces_an_earlier_backup_of_the_same_database(
    stopped_host: dict[str, Path],
) -> None:
    """The refusals above keep the one use: a backup over the last one, also over one that an
    earlier release (an older schema version) took."""
    for source, dest in (
        ("index", "index backup"),
        ("runs", "runs backup"),
        ("index", "older index backup"),
    ):
        result = run_script(BACKUP, str(stopped_host[source]), str(stopped_host[dest]))
        assert result.returncode == 0, (dest, result.stderr)
    replaced = stopped_host["older index backup"].read_bytes()
    assert replaced == stopped_host["index backup"].read_bytes()


@pytest.mark.parametrize("name", ["check-image", "check-compose"])
def test_the_check_scripts_are_executable_bash_with_valid_syntax(name: str) -> None:
    script = DEPLOY / name
    assert os.access(script, os.X_OK)
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert "\ntrap cleanup EXIT\n" in text  # containers and volumes go, whatever happens
    assert '\nsource "$REPO/deploy/lib/podman.sh"\n' in text
    for path in (script, DEPLOY / "lib" / "podman.sh", DEPLOY / "pgvector" / "entrypoint.sh"):
        result = subprocess.run(
            ["bash", "-n", str(path)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, (path, result.stderr)


def test_check_compose_brings_up_the_scale_out_file_it_documents() -> None:
    text = (DEPLOY / "check-compose").read_text(encoding="utf-8")
    compose = yaml_documents(DEPLOY / "compose.scale-out.yaml")[0]
    assert "-f compose.scale-out.yaml" in text
    # The stand-in database image is the compose file's default replaced, nothing else.
    assert compose["services"]["postgres"]["image"] == "${PGVECTOR_IMAGE:-pgvector/pgvector:pg17}"
    assert "PGVECTOR_IMAGE=$PGVECTOR_IMAGE podman-compose" in text
    # The ports it checks are the ones the replicas publish.
    published = sorted(
        port.split(":")[1]
        for service in compose["services"].values()
        for port in service.get("ports", [])
    )
    assert published == ["8443", "8444"]
    assert "for port in 8443 8444; do" in text


def test_every_run_line_and_manifest_gives_the_host_the_stop_timeout_check_image_uses() -> None:
    """check-image stops the container with CHECK_IMAGE_STOP_S (30 s) while an ingest is in
    flight and requires exit 0 before it: every way of running the host must allow as much,
    and more than the host's own shutdown grace (limits.shutdownGraceS)."""
    text = (DEPLOY / "check-image").read_text(encoding="utf-8")
    (stop_s,) = re.findall(r"STOP_S=\$\{CHECK_IMAGE_STOP_S:-(\d+)\}", text)
    timeout = int(stop_s)
    assert LimitSettings().shutdown_grace_s < timeout
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    # The lines that start a host (detached or publishing its port), not one-off commands.
    run_lines = [
        line
        for line in readme.splitlines()
        if re.search(r"(docker|podman) run ", line) and re.search(r" (-d|-p) ", line)
    ]
    assert run_lines
    for line in run_lines:
        assert f"--stop-timeout {timeout}" in line, line
    for path in sorted(DEPLOY.glob("compose*.yaml")):
        compose = yaml_documents(path)[0]
        for name, service in compose["services"].items():
            if "build" in service or service.get("<<"):
                assert service.get("stop_grace_period") == f"{timeout}s", (path.name, name)
    for overlay in ("sqlite", "postgres"):
        pod = k8s_object("Deployment", "retrieval-host", overlay)["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == timeout
    unit = (DEPLOY / "systemd" / "retrieval-host.service").read_text(encoding="utf-8")
    assert f"\nTimeoutStopSec={timeout}s\n" in unit

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

from retrieval_host.settings import HostSettings, LimitSettings, ListenSettings, TlsSettings
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

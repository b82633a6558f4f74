"""Inputs the command line cannot use end in one `retrieval-host: ...` line (or argparse's
usage error) and exit 2, never a traceback and exit 1: exit 2 is what a service manager's
`RestartPreventExitStatus=2` and a script's error handling rely on (probe O, session 40)."""

from __future__ import annotations

import json
import logging
import logging.config
import socket
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from retrieval_host.adapters.wiring import build_run_store, sqlite_runs_path
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.serving.cli import main
from retrieval_host.settings import load_settings

SQL_INTEGER_MAX = 2**63 - 1  # SQLite's largest integer (and PostgreSQL's bigint)


@pytest.fixture(autouse=True)
def _logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # `serve` configures the process's logging onto pytest's captured stderr, closed after
    # the test: a later test's log line would fail to write. These tests read the error line.
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: None)
    monkeypatch.setattr(logging, "captureWarnings", lambda capture: None)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of `retrieval-host ARGV`, which must exit 2."""
    try:
        code = main(argv, environ={})
    except SystemExit as exc:  # argparse's usage error
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    [line] = [ln for ln in error.splitlines() if ln.startswith("retrieval-host")]
    return line


def _config(directory: Path, body: dict[str, Any]) -> Path:
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / "host.json"
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "prune", "--before", "0001-01-01T00:00:00+01:00"],
        ["usage", "--since", "9999-12-31T23:30:00-01:00"],
    ],
    ids=["year-0-in-utc", "year-10000-in-utc"],
)
def test_a_time_outside_the_calendar_in_utc_is_a_usage_error(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # An OverflowError converting to UTC, with a traceback.
    config = _config(tmp_path / "state", {"behindProxy": True})
    line = _refused([*argv, "--config", str(config)], capsys)
    assert "is not a time of the years 0001-9999 in UTC" in line


def test_a_limit_past_what_sqlite_binds_is_a_usage_error_and_the_largest_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2**63 was an OverflowError binding it, with a traceback.
    config = _config(tmp_path / "state", {"behindProxy": True, "runs": {"sqlitePath": "runs.db"}})
    build_run_store(load_settings(config, {}), {}).close()  # a run store, no records
    for limit in (str(SQL_INTEGER_MAX + 1), "9" * 23):
        line = _refused(["usage", "--config", str(config), "--limit", limit], capsys)
        assert f"is not a whole number from 1 to {SQL_INTEGER_MAX}" in line
    largest = ["usage", "--config", str(config), "--limit", str(SQL_INTEGER_MAX), "--json"]
    assert main(largest, environ={}) == 0
    assert capsys.readouterr().out == ""


def test_a_configuration_without_a_store_is_told_to_set_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `"store": {}` was told "set runs.sqlitePath.", which would still leave no vector store;
    # and `runs prune` raised it as a traceback.
    config = _config(tmp_path / "state", {"behindProxy": True, "store": {}})
    with pytest.raises(RetrievalError) as raised:
        sqlite_runs_path(load_settings(config, {}))
    assert raised.value.code is ErrorCode.STORE_UNAVAILABLE
    assert "set store.sqlitePath or store.postgresDsn" in str(raised.value)
    for argv in (["runs", "prune", "--before", "2026-01-01"], ["usage"]):
        line = _refused([*argv, "--config", str(config)], capsys)
        assert "set store.sqlitePath or store.postgresDsn" in line


def test_a_host_file_nested_too_deeply_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "host.json"
    deep = "[" * 100_000  # unclosed: the parser gives up on the depth first
    config.write_text(f'{{"behindProxy": true, "applicationOptions": {{"x": {deep}}}}}')
    line = _refused(["serve", "--config", str(config)], capsys)
    assert line == f"retrieval-host: {config}: " + (
        "nested too deeply (more than 64 levels of arrays and objects)"
    )


def _encrypted(key_pem: bytes, password: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password),
    )


def test_a_key_password_for_a_key_that_is_not_encrypted_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # OpenSSL asks for a password only to decrypt: set beside a plain key it did nothing,
    # silently, where every other setting that cannot take effect is refused.
    leaf = trustme.CA().issue_cert("127.0.0.1")
    tls = tmp_path / "tls"
    tls.mkdir()
    leaf.cert_chain_pems[0].write_to_path(str(tls / "server.pem"))
    leaf.private_key_pem.write_to_path(str(tls / "plain-key.pem"))
    (tls / "encrypted-key.pem").write_bytes(_encrypted(leaf.private_key_pem.bytes(), b"s3cret"))
    (tls / "password").write_text("s3cret\n")
    (tls / "password").chmod(0o600)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        def serve(key: str) -> str:
            tls_settings = {"certFile": "tls/server.pem", "keyFile": f"tls/{key}"}
            tls_settings["keyPassword"] = {"file": "tls/password"}  # type: ignore[assignment]
            body = {"listen": {"port": port}, "tls": tls_settings}
            config = tmp_path / "host.json"
            config.write_text(json.dumps(body))
            return _refused(["serve", "--config", str(config)], capsys)

        plain = serve("plain-key.pem")
        assert plain == (
            f"retrieval-host: tls.keyPassword is set, but tls.keyFile {tls / 'plain-key.pem'} "
            "is not encrypted: remove keyPassword (or encrypt the key)"
        )
        # The password of an encrypted key passes, and the start goes on to the next check:
        # the port, held here, so that nothing is served.
        encrypted = serve("encrypted-key.pem")
        assert f"cannot listen on 127.0.0.1:{port}" in encrypted

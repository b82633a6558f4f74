"""deploy/systemd/retrieval-host.service: a unit systemd accepts, hardened as documented."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

from retrieval_host.settings import load_settings
from tests.support.deploy import DEPLOY

UNIT = DEPLOY / "systemd" / "retrieval-host.service"
EXEC = "/opt/retrieval-host/bin/retrieval-host"


def unit_problems(text: str, directory: Path) -> list[str]:
    """What `systemd-analyze verify` reports for the unit (a parse check where it is missing).

    The unit's ExecStart names the install location, absent here; verify checks that the
    binary exists, so a copy points at a stub executable instead.
    """
    stub = directory / "retrieval-host"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = directory / "retrieval-host.service"
    unit.write_text(text.replace(EXEC, str(stub)), encoding="utf-8")
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        result = subprocess.run(
            [analyze, "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = (result.stdout + result.stderr).splitlines()
        problems = [line for line in lines if line.strip()]
        if result.returncode != 0:
            problems.append(f"systemd-analyze verify exited {result.returncode}")
        return problems
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        return [str(exc)]
    return [s for s in parser.sections() if s not in ("Unit", "Service", "Install")]


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    assert unit_problems(UNIT.read_text(encoding="utf-8"), tmp_path) == []


def test_the_check_reports_a_misspelt_directive(tmp_path: Path) -> None:
    text = UNIT.read_text(encoding="utf-8").replace("[Install]", "[Instal]")
    assert unit_problems(text, tmp_path) != []


def _directives() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_unit_runs_the_host_hardened_with_a_private_state_directory() -> None:
    d = _directives()
    assert d["ExecStart"] == [f"{EXEC} serve --config /etc/retrieval-host/host.json"]
    for key, value in {
        "DynamicUser": "yes",
        "StateDirectory": "retrieval-host",
        "StateDirectoryMode": "0700",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "UMask": "0077",
    }.items():
        assert d[key] == [value], key
    # The key stays root's; the host reads it as a credential through a settings override.
    assert d["LoadCredential"] == ["tls-key:/etc/retrieval-host/tls/server-key.pem"]
    assert "RETRIEVAL_HOST_TLS__KEY_FILE=%d/tls-key" in d["Environment"]


def test_the_credential_override_reaches_the_tls_key_setting() -> None:
    credential = "/run/credentials/retrieval-host.service/tls-key"
    settings = load_settings(
        DEPLOY / "compose" / "host.json", {"RETRIEVAL_HOST_TLS__KEY_FILE": credential}
    )
    assert settings.tls is not None
    assert str(settings.tls.key_file) == credential

"""The transport settings: `behindProxy` (plain HTTP, X-Forwarded-* trusted from loopback) is
accepted only on a loopback listen address, with or without `tls` (deploy/README, "TLS")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retrieval_host.settings import SettingsError, load_settings

TLS = {"certFile": "tls/cert.pem", "keyFile": "tls/key.pem"}


def _load(tmp_path: Path, config: dict[str, Any]) -> Any:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(config))
    return load_settings(path, {})


@pytest.mark.parametrize("tls", [None, TLS], ids=["plain", "tls"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "host.example"])
def test_behind_proxy_is_refused_on_a_listen_address_other_than_loopback(
    tmp_path: Path, tls: dict[str, str] | None, host: str
) -> None:
    # Probe O, session 40: beside `tls` it was accepted, and the host then trusted
    # X-Forwarded-For/-Proto from any local process on a public TLS listener.
    config: dict[str, Any] = {"behindProxy": True, "listen": {"host": host}}
    if tls is not None:
        config["tls"] = tls
    with pytest.raises(SettingsError, match="behindProxy needs a loopback listen host"):
        _load(tmp_path, config)


@pytest.mark.parametrize("tls", [None, TLS], ids=["plain", "tls"])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_behind_proxy_is_accepted_on_loopback(
    tmp_path: Path, tls: dict[str, str] | None, host: str
) -> None:
    config: dict[str, Any] = {"behindProxy": True, "listen": {"host": host}}
    if tls is not None:
        config["tls"] = tls
    settings = _load(tmp_path, config)
    assert settings.behind_proxy is True
    assert settings.listen.host == host


def test_tls_without_behind_proxy_may_listen_on_every_interface(tmp_path: Path) -> None:
    settings = _load(tmp_path, {"tls": TLS, "listen": {"host": "0.0.0.0"}})
    assert settings.behind_proxy is False

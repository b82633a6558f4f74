"""`store.efSearch` sizes only the HNSW index's probes: beside `hnsw` off it was accepted and
ignored (a black-box probe), so the start refuses it, as it refuses a key of the other store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from retrieval_host.settings import HostSettings, SettingsError, load_settings

PG: dict[str, Any] = {"postgresDsn": {"env": "DSN"}, "postgresSchema": "x"}


def _load(
    tmp_path: Path, store: dict[str, Any], environ: Mapping[str, str] | None = None
) -> HostSettings:
    path = tmp_path / "host.json"
    config = {"tls": {"certFile": "tls/cert.pem", "keyFile": "tls/key.pem"}, "store": store}
    path.write_text(json.dumps(config))
    return load_settings(path, environ or {})


@pytest.mark.parametrize(
    ("store", "environ"),
    [
        ({**PG, "efSearch": 400}, {}),
        ({**PG, "efSearch": 100, "hnsw": False}, {}),  # the default value, still said in vain
        ({**PG, "hnsw": True, "efSearch": 400}, {"RETRIEVAL_HOST_STORE__HNSW": "false"}),
        (PG, {"RETRIEVAL_HOST_STORE__EF_SEARCH": "400"}),
    ],
)
def test_ef_search_without_hnsw_is_refused_at_start(
    tmp_path: Path, store: dict[str, Any], environ: dict[str, str]
) -> None:
    with pytest.raises(SettingsError, match=r"store\.efSearch applies only beside store\.hnsw"):
        _load(tmp_path, store, environ)


def test_ef_search_beside_hnsw_is_used(tmp_path: Path) -> None:
    settings = _load(tmp_path, {**PG, "hnsw": True, "efSearch": 400})
    assert (settings.store.hnsw, settings.store.ef_search) == (True, 400)
    assert _load(tmp_path, PG).store.ef_search == 100  # unset: the default, no refusal

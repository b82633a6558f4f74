"""Configuration files nested too deeply: one `SettingsError` naming the file, never a
RecursionError (probe O, session 40: `[` * 100000 in host.json or its tokensFile was a
traceback and exit 1 at start, which a service manager's `RestartPreventExitStatus=2` does not
stop restarting)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval_host.settings import SettingsError, load_settings
from retrieval_host.unique_json import load_unique_json

BASE = {"behindProxy": True}
MAX_DEPTH = 64  # `unique_json.MAX_DEPTH`, as the README states it


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 600, 100_000])
def test_a_host_file_nested_too_deeply_is_one_settings_error(tmp_path: Path, levels: int) -> None:
    # 600: deeper than pydantic validates (its error repeated `list.0.` per level), not yet
    # deep enough for `json` to raise RecursionError; 100,000: past it.
    config = tmp_path / "host.json"
    config.write_text(
        json.dumps(BASE)[:-1] + f', "applicationOptions": {{"x": {_nested(levels)}}}}}'
    )
    with pytest.raises(SettingsError, match="nested too deeply") as refused:
        load_settings(config, {})
    assert str(config) in str(refused.value)
    assert "list.0" not in str(refused.value)


def test_a_tokens_file_nested_too_deeply_is_one_settings_error(tmp_path: Path) -> None:
    (tmp_path / "tokens.json").write_text(_nested(100_000))
    config = tmp_path / "host.json"
    config.write_text(json.dumps({**BASE, "tokensFile": "tokens.json"}))
    with pytest.raises(SettingsError, match=r"tokensFile .*tokens\.json: nested too deeply"):
        load_settings(config, {})


def test_nesting_up_to_the_bound_is_read() -> None:
    assert load_unique_json(_nested(MAX_DEPTH)) is not None
    deep_object = '{"a": ' * MAX_DEPTH + "1" + "}" * MAX_DEPTH
    assert load_unique_json(deep_object) is not None
    for refused in (_nested(MAX_DEPTH + 1), '{"a": ' * 5000 + "1" + "}" * 5000):
        with pytest.raises(ValueError, match="nested too deeply"):
            load_unique_json(refused)
    # Scalars and flat documents are no containers to count.
    assert load_unique_json('[1, {"a": [2]}, "x"]') == [1, {"a": [2]}, "x"]

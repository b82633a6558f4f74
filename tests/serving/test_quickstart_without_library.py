"""A quickstart rerun on a state whose host.json no longer serves corpus `library` says so in
one line and exits 2 (probe H, session 40: it ended in a PERMISSION_DENIED traceback)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retrieval_host.serving.quickstart import prepare_state
from tests.support.ports import free_port
from tests.support.quickstart import cli


def _rerun_refused(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> str:
    """A quickstart state whose host.json `edit` changed, rerun with `--no-serve`: the one
    line it is refused with (exit 2, no traceback)."""
    host_file = prepare_state(tmp_path / "state", free_port())
    config = json.loads(host_file.read_text())
    edit(config)
    host_file.write_text(json.dumps(config))
    done = subprocess.run(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(free_port()), "--no-serve"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Try it" not in done.stdout  # no command printed
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "retrieval-host serve --config state/host.json" in lines[0]
    return lines[0]


def test_a_rerun_on_a_state_that_no_longer_configures_library_says_so_and_exits_2(
    tmp_path: Path,
) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["applicationOptions"]["corpora"] = ["rr"]
        for operation in ("search", "index", "delete"):
            config["tokens"][0]["retrieval"][operation] = ["rr"]

    line = _rerun_refused(tmp_path, edit)
    assert "into corpus 'library'" in line
    assert "no longer configures or grants" in line


def test_a_rerun_whose_demo_token_may_no_longer_search_library_says_so_and_exits_2(
    tmp_path: Path,
) -> None:
    """Probe R, session 41: with only the token's grant gone, the quickstart indexed and
    answered in-process (its own subject) and printed commands that all answered 403."""

    def edit(config: dict[str, Any]) -> None:
        config["tokens"][0]["retrieval"]["search"] = []

    line = _rerun_refused(tmp_path, edit)
    assert "demo token may no longer search in corpus 'library'" in line
    assert "index" not in line.split("may no longer")[1].split(" in state")[0]


def test_a_rerun_whose_demo_token_lost_its_write_or_provider_grants_names_them_and_exits_2(
    tmp_path: Path,
) -> None:
    """Review V, session 41: with search kept but index, delete and the provider gone, the
    printed ingest, delete and run commands answered 403."""

    def edit(config: dict[str, Any]) -> None:
        config["tokens"][0]["retrieval"]["index"] = []
        config["tokens"][0]["retrieval"]["delete"] = []
        config["tokens"][0]["providers"] = []

    line = _rerun_refused(tmp_path, edit)
    for lost in ("index in corpus 'library'", "delete in corpus", "provider 'local'"):
        assert lost in line, line
    assert "search in corpus" not in line

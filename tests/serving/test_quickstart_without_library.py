"""A quickstart rerun on a state whose host.json no longer serves corpus `library` says so in
one line and exits 2 (probe H, session 40: it ended in a PERMISSION_DENIED traceback)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from retrieval_host.serving.quickstart import prepare_state
from tests.support.ports import free_port
from tests.support.quickstart import cli


def test_a_rerun_on_a_state_that_no_longer_configures_library_says_so_and_exits_2(
    tmp_path: Path,
) -> None:
    host_file = prepare_state(tmp_path / "state", free_port())
    config = json.loads(host_file.read_text())
    config["applicationOptions"]["corpora"] = ["rr"]
    for operation in ("search", "index", "delete"):
        config["tokens"][0]["retrieval"][operation] = ["rr"]
    host_file.write_text(json.dumps(config))
    done = subprocess.run(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(free_port()), "--no-serve"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "into corpus 'library'" in lines[0]
    assert "no longer configures or grants" in lines[0]
    assert "retrieval-host serve --config state/host.json" in lines[0]


def test_a_rerun_whose_demo_token_may_no_longer_search_library_says_so_and_exits_2(
    tmp_path: Path,
) -> None:
    """Probe R, session 41: with only the token's grant gone, the quickstart indexed and
    answered in-process (its own subject) and printed commands that all answered 403."""
    host_file = prepare_state(tmp_path / "state", free_port())
    config = json.loads(host_file.read_text())
    config["tokens"][0]["retrieval"]["search"] = []
    host_file.write_text(json.dumps(config))
    done = subprocess.run(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(free_port()), "--no-serve"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "demo token may not search corpus 'library'" in lines[0]
    assert "retrieval-host serve --config state/host.json" in lines[0]
    assert "Try it" not in done.stdout  # no command printed

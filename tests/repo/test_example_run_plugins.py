"""`examples/run_plugins.py` runs as written: the application's retriever, effect, context
policy and verifier shape a real run (local model, SQLite, the extractive provider)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.examples import ROOT


def test_the_plugins_example_runs_and_each_plugin_shows() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "run_plugins.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("- ") and "[source:" in line for line in lines)
    # The retriever put the memo last, the context policy kept two: the memo never reached
    # the model, so it is not in the manifest.
    assert "manifest: ['battery-study', 'solar-notes']" in lines
    # The effect saw all three sources of the search, in the retriever's order.
    assert any(
        line.startswith("extensions: {'audit'")
        and "'sources': ['battery-study', 'solar-notes', 'wind-memo']" in line
        for line in lines
    )
    # The extractive answer cites both passages it read (each shares a word with the
    # question, "batteries" and "panels" as stems): the verifier accepts it.
    assert "verification: accepted" in lines

"""`examples/custom_retrieval.py` runs as written: an application's own retrieval goes through
the lifecycle (authorized, re-checked after the read, effects after it) on real components."""

from __future__ import annotations

import subprocess
import sys

from tests.support.examples import ROOT


def test_the_custom_retrieval_example_finds_only_what_the_caller_may_read() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_retrieval.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    sources = ("field-log", "pump-manual", "hr-memo")
    found = sorted(line.split(":", 1)[0] for line in lines if line.startswith(sources))
    # The phrase is in all three sources; the technician may not read the HR memo.
    assert found == ["field-log", "pump-manual"]
    assert "extensions: {'by_source': {'pump-manual': 1, 'field-log': 1}}" in lines or (
        "extensions: {'by_source': {'field-log': 1, 'pump-manual': 1}}" in lines
    )
    assert "visitor 'E-417': PERMISSION_DENIED" in lines  # authorize refused it
    assert "technician 'E4': INVALID_REQUEST" in lines  # assert input refused it

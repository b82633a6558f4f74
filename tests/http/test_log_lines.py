"""The host's stderr holds only JSON lines, a library's Python warning included."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import warnings
from retrieval_host.http.logs import configure_logging
configure_logging("info", worker=1)
warnings.warn("a library's warning\\nover two lines", UserWarning, stacklevel=1)
"""


def test_a_python_warning_is_one_json_line_on_stderr() -> None:
    # Found by probe S (session 38): the parse workers sent warnings to the host's log, but the
    # host process itself let `warnings` print its free text (the message, then a source line).
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    [line] = done.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "warning" and entry["logger"] == "py.warnings"
    assert entry["worker"] == 1
    assert "a library's warning\nover two lines" in entry["message"]

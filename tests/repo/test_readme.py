"""The README's in-process snippet is the example file, and it runs and prints every field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_snippet_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- snippet: in-process -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert match is not None
    assert match.group(1) == (ROOT / "examples" / "in_process.py").read_text(encoding="utf-8")


def test_readme_snippet_indexes_searches_and_prints_every_hit_field(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "in_process.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=True,
    ).stdout
    first = out.split("\n[source:")[0]
    assert first.startswith("[source:battery-study-p1]")
    for field in ("score=", "source=battery-study@r1", "location=Location(page=1", "text=",
                  "documentSha256=", "retrievedAt=", "scope=Scope(corpus='library'"):  # fmt: skip
        assert field in first
    assert "truncated=True" in out  # three matches, limit 2

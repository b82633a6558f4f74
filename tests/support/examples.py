"""The README's example files: the snippet the README shows, and a run of the file as written
against a host over HTTPS (real uvicorn, TLS), as a newcomer would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.host import World, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]


def readme_snippet(name: str) -> str:
    """The Python block after `<!-- snippet: NAME -->` in the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert match is not None, f"no snippet {name!r} in the README"
    return match.group(1)


def run_example(example: Path, world: World) -> subprocess.CompletedProcess[str]:
    """Run `example` as the README says (base URL and CA bundle as arguments, the admin token
    in `RETRIEVAL_HOST_TOKEN`) against `world` served over HTTPS."""
    with serve_in_thread(world.settings(), world.driver, world.tls) as host:
        env = {**os.environ, "RETRIEVAL_HOST_TOKEN": world.tokens["admin"]}
        return subprocess.run(
            [sys.executable, str(example), host.base_url, str(world.tls.ca_file)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )

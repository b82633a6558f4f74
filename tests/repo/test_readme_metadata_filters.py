"""The README's metadata example is `examples/metadata_filters.py`, and it runs as written over
HTTPS (real uvicorn, TLS): metadata given at ingest, then filtered on with operators."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.host import build_world, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "metadata_filters.py"


def test_the_readme_example_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- snippet: metadata -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert match is not None
    assert match.group(1) == EXAMPLE.read_text(encoding="utf-8")


def test_the_readme_example_runs_over_https(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    world = build_world(tmp_path / "world", local_embedding)
    try:
        with serve_in_thread(world.settings(), world.driver, world.tls) as host:
            env = {**os.environ, "RETRIEVAL_HOST_TOKEN": world.tokens["admin"]}
            done = subprocess.run(
                [sys.executable, str(EXAMPLE), host.base_url, str(world.tls.ca_file)],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                check=False,
            )
        assert done.returncode == 0, done.stderr
        # 2019 is English but too old; the seeded handbook has no `kind`: neither is found.
        assert sorted(done.stdout.splitlines()) == [
            "inspection-2022: year 2022, en",
            "inspection-2024: year 2024, de",
        ]
    finally:
        world.close()

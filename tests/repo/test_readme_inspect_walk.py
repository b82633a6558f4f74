"""The README's inspection walk is `examples/inspect_walk.py`, and it runs as written over HTTPS
(real uvicorn, TLS): list, inspect, navigate a citation, delete by the listed revision."""

from __future__ import annotations

from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.examples import ROOT, readme_snippet, run_example
from tests.support.host import CORPUS, HANDBOOK, build_world

EXAMPLE = ROOT / "examples" / "inspect_walk.py"


def test_the_readme_walk_is_the_example_file() -> None:
    assert readme_snippet("inspect") == EXAMPLE.read_text(encoding="utf-8")


def test_the_readme_walk_runs_over_https(tmp_path: Path, local_embedding: LocalEmbedding) -> None:
    world = build_world(tmp_path / "world", local_embedding)
    try:
        done = run_example(EXAMPLE, world)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"{CORPUS}: 2 sources, {len(HANDBOOK) + 1} passages")
        assert "  handbook @ r1: 3 passages" in lines
        assert "  handbook-0: {'page': 1, 'start_line': 1}, " in done.stdout
        assert "cited handbook@r1: " in done.stdout
        assert f"deleted {len(HANDBOOK)} passages of handbook@r1" in lines
        assert lines[-1] == "the citation is unavailable now: its revision is gone"
        assert "handbook" not in world.registry.current(CORPUS, "team")
    finally:
        world.close()

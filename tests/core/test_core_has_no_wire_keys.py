"""Core holds no wire keys: camelCase names live in `retrieval_host.wire`, so the JSON shapes
of the host can change without touching the domain."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import retrieval_host.core

CORE = Path(retrieval_host.core.__file__).parent
CAMEL_CASE = re.compile(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+")
# camelCase strings in core that are not wire keys of this host, each with its reason.
NOT_WIRE_KEYS = {
    # Hashed into every stored revision fingerprint: renaming it would make every indexed
    # revision look changed. A digest input, never sent or parsed.
    ("fingerprint.py", "documentSha256"),
    # A JSON Schema keyword in the search tool offered to the model, not our vocabulary.
    ("runs/retrieval.py", "additionalProperties"),
    # Keys of the metadata ingestion stores with each revision (its `sections` and `messages`
    # entries), read to pick a hit's own entry: stored data, not the host's wire shapes.
    ("passage_metadata.py", "startLine"),
    ("passage_metadata.py", "endLine"),
    ("passage_metadata.py", "messageId"),
    ("passage_metadata.py", "mediaType"),
}


def _camel_case_strings(path: Path) -> list[tuple[str, int]]:
    """Every string constant (f-string parts too) that is one camelCase identifier."""
    return [
        (node.value, node.lineno)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and CAMEL_CASE.fullmatch(node.value)
    ]


def test_core_holds_no_camel_case_wire_key() -> None:
    offenders = []
    seen = set()
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        name = path.relative_to(CORE).as_posix()
        for value, line in _camel_case_strings(path):
            if (name, value) in NOT_WIRE_KEYS:
                seen.add((name, value))
            else:
                offenders.append(f"{name}:{line} holds the wire key {value!r}")
    assert offenders == []
    assert seen == NOT_WIRE_KEYS  # an exemption that no longer applies is removed


def test_the_checker_would_catch_a_wire_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(body, loc):\n"
        '    """A docstring may say startLine and runId in prose."""\n'
        '    error = f"maxGenerationSteps must be in 1..{loc}."\n'
        '    return {"runId": body["run_id"], "page": loc.get("startLine"), "error": error}\n',
        encoding="utf-8",
    )
    assert _camel_case_strings(bad) == [("runId", 4), ("startLine", 4)]

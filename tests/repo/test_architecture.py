"""docs/ARCHITECTURE.md draws the package-level import graph; the code must not have an arrow
the drawing lacks, and the drawing must not keep an arrow the code no longer has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import retrieval_host
import retrieval_host_client

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(retrieval_host.__file__).parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
ARROW = re.compile(r"^\s*([\w.]+)\s*-->\s*([\w.]+)\s*$")


def _unit(module: str) -> str | None:
    """The drawing's node for a module of the package: its subpackage, or the loose module."""
    parts = module.split(".")
    if parts[0] == "retrieval_host_client":
        return "client"  # the wire schema the host shares with its client, drawn as one node
    if parts[0] != "retrieval_host" or len(parts) < 2:
        return None
    return parts[1]


def _imported(path: Path, package: Path) -> set[str]:
    found: set[str] = set()
    own = ".".join(("retrieval_host", *path.relative_to(package).with_suffix("").parts))
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own.split(".")[: -node.level]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
                # `from retrieval_host import x` names the module x
                if node.module == "retrieval_host":
                    found |= {f"retrieval_host.{alias.name}" for alias in node.names}
    return found


def code_arrows(package: Path = PACKAGE) -> set[tuple[str, str]]:
    arrows: set[tuple[str, str]] = set()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if len(relative.parts) == 1 and relative.name == "__init__.py":
            continue  # the package root re-exports the in-process API; drawn as `api`
        source = _unit(".".join(("retrieval_host", *relative.with_suffix("").parts)))
        for module in _imported(path, package):
            target = _unit(module)
            if source and target and target != source:
                arrows.add((source, target))
    return arrows


def drawn_arrows(text: str) -> set[tuple[str, str]]:
    block = re.search(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert block, "docs/ARCHITECTURE.md has no mermaid import graph"
    arrows = set()
    for line in block.group(1).splitlines():
        match = ARROW.match(line)
        if match:
            arrows.add((match.group(1), match.group(2)))
    return arrows


def test_the_drawing_matches_the_code() -> None:
    code = code_arrows()
    drawn = drawn_arrows(DOC.read_text(encoding="utf-8"))
    assert len(code) >= 10
    assert sorted(code - drawn) == [], "imports the drawing does not show"
    assert sorted(drawn - code) == [], "arrows the code no longer has"


def test_core_depends_on_nothing_else() -> None:
    assert {target for source, target in code_arrows() if source == "core"} == set()


def test_the_client_does_not_import_the_host() -> None:
    client = Path(retrieval_host_client.__file__).parent
    imported = set().union(*(_imported(path, client) for path in client.rglob("*.py")))
    assert sorted(m for m in imported if m.split(".")[0] == "retrieval_host") == []


def test_a_new_arrow_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "retrieval_host"
    (package / "core").mkdir(parents=True)
    (package / "core" / "bad.py").write_text("from retrieval_host.http import app\n")
    (package / "http").mkdir()
    (package / "http" / "app.py").write_text("from ..core import bad\n")
    assert code_arrows(package) == {("core", "http"), ("http", "core")}

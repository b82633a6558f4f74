"""The core stays free of I/O: no web framework, HTTP client, database driver or parser."""

from __future__ import annotations

import ast
from pathlib import Path

import retrieval_host.core

CORE = Path(retrieval_host.core.__file__).parent
ALLOWED_ROOTS = {
    "__future__", "collections", "contextlib", "dataclasses", "datetime", "decimal", "enum",
    "functools",
    "hashlib", "json", "math", "operator",
    "re", "secrets", "threading", "time", "typing", "numpy", "retrieval_host", "Stemmer",
    "unicodedata", "weakref", "zlib",
}  # fmt: skip
FORBIDDEN_ROOTS = {
    "starlette", "fastapi", "uvicorn", "httpx", "requests", "urllib", "http", "socket", "ssl",
    "apsw", "sqlite3", "psycopg", "pgvector", "pypdf", "bs4", "email", "mailbox", "onnxruntime",
    "tokenizers", "os", "subprocess", "pathlib", "io", "shutil", "asyncio", "anyio",
}  # fmt: skip


def _imports(path: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(("retrieval_host.core", node.lineno))
            elif node.module:
                found.append((node.module, node.lineno))
    return found


def test_core_imports_only_pure_modules() -> None:
    offenders = []
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        for module, line in _imports(path):
            root = module.split(".")[0]
            inside = module == "retrieval_host.core" or module.startswith("retrieval_host.core.")
            if (
                root in FORBIDDEN_ROOTS
                or root not in ALLOWED_ROOTS
                or (root == "retrieval_host" and not inside)
            ):
                offenders.append(f"{path.name}:{line} imports {module}")
    assert offenders == []


def test_the_checker_would_catch_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom retrieval_host.adapters import x\n", encoding="utf-8")
    modules = [m for m, _ in _imports(bad)]
    assert modules == ["httpx", "retrieval_host.adapters"]

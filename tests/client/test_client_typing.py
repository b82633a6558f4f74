"""The keyword form of the client's requests is typed: a type checker refuses a misspelled or
mistyped field before anything runs, and each keyword set matches its request model."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from retrieval_host_client import (
    DeleteFields,
    DeleteRequest,
    IndexFields,
    IndexRequest,
    RunFields,
    RunRequest,
    SearchFields,
    SearchRequest,
)


@pytest.mark.parametrize(
    ("fields", "model"),
    [
        (SearchFields, SearchRequest),
        (IndexFields, IndexRequest),
        (DeleteFields, DeleteRequest),
        (RunFields, RunRequest),
    ],
)
def test_each_keyword_set_names_its_models_fields(fields: type, model: type[BaseModel]) -> None:
    assert set(fields.__annotations__) == set(model.model_fields)


USES = """
    from retrieval_host_client import AsyncClient, Client

    def use(client: Client) -> None:
        client.search_context(corpus="library", query="q", limit=2, mode="lexical")
        client.search_context(corpus="library", qeury="typo")
        client.search_context(corpus="library", query="q", limit="2")
        client.search_context(corpus="library", query="q", mode="semantic")
        client.run(provider="local", modle="extractive", input="q")
        client.delete_context(corpus="library", source_id="a", revision=1)
        client.index_context(corpus="library", source={"id": "a"}, chunks=[{"id": "c"}])

    async def use_async(client: AsyncClient) -> None:
        await client.search_context(corpus="library", top_k=3)
        async with client.stream_run(provider="local", model="m", input="q", max_tokens="9"):
            pass
"""


def _mypy_errors(
    snippet: Path, *options: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[str, int, list[tuple[int, str]]]:
    """mypy --strict's report on `snippet`, its exit status, and (line, code) per error."""
    # In a process of its own: mypy raises the interpreter's recursion limit for good, and
    # other tests in this process rely on the default (deeply nested JSON refused).
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *options, str(snippet)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=env,
    )
    report = checked.stdout
    errors = sorted(
        (int(line.split(":")[1]), line.rsplit("[", 1)[1].rstrip("]"))
        for line in report.splitlines()
        if ": error: " in line
    )
    return report, checked.returncode, errors


def test_a_type_checker_refuses_misspelled_and_mistyped_keywords(tmp_path: Path) -> None:
    snippet = tmp_path / "uses.py"
    snippet.write_text(textwrap.dedent(USES))
    report, status, errors = _mypy_errors(snippet)
    assert status == 1
    assert errors == [
        (6, "call-arg"),  # qeury
        (7, "arg-type"),  # limit="2"
        (8, "arg-type"),  # mode="semantic"
        (9, "call-arg"),  # modle
        (10, "arg-type"),  # revision=1
        (14, "call-arg"),  # top_k
        (15, "arg-type"),  # max_tokens="9"
    ], report


DOCUMENTED = """
    import contextlib

    from retrieval_host_client import AsyncClient, Client, RunRetrieval, SearchRequest

    def sequences() -> None:
        SearchRequest(corpus="library", query="q", source_ids=("a", "b"))
        RunRetrieval(corpus="library", source_ids=("a", "b"))
        RunRetrieval(corpus="library", source_ids="ab")

    def stop_early(client: Client) -> None:
        with contextlib.closing(client.list_sources("library")) as sources:
            next(sources)

    async def stop_early_async(client: AsyncClient) -> None:
        async with contextlib.aclosing(client.list_sources("library")) as sources:
            async for _ in sources:
                break
"""


def test_the_documented_forms_type_check_in_user_code_without_the_pydantic_plugin(
    tmp_path: Path,
) -> None:
    # User code as an application has it: no config of this repository (so no pydantic
    # plugin, which types model constructors loosely), and the client as an installed package
    # whose own code is not reported (`--follow-imports=silent`).
    snippet = tmp_path / "documented.py"
    snippet.write_text(textwrap.dedent(DOCUMENTED))
    client_root = Path(__file__).resolve().parents[2] / "sdk_client"
    env = {**os.environ, "MYPYPATH": str(client_root)}
    options = ("--config-file=", "--follow-imports=silent")
    report, status, errors = _mypy_errors(snippet, *options, cwd=tmp_path, env=env)
    assert status == 1
    assert errors == [(9, "arg-type")], report  # a bare str is not a tuple of ids

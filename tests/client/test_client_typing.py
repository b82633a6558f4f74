"""The keyword form of the client's requests is typed: a type checker refuses a misspelled or
mistyped field before anything runs, and each keyword set matches its request model."""

from __future__ import annotations

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


def test_a_type_checker_refuses_misspelled_and_mistyped_keywords(tmp_path: Path) -> None:
    snippet = tmp_path / "uses.py"
    snippet.write_text(textwrap.dedent(USES))
    # In a process of its own: mypy raises the interpreter's recursion limit for good, and
    # other tests in this process rely on the default (deeply nested JSON refused).
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(snippet)],
        capture_output=True,
        text=True,
        check=False,
    )
    report, status = checked.stdout, checked.returncode
    errors = sorted(
        (int(line.split(":")[1]), line.rsplit("[", 1)[1].rstrip("]"))
        for line in report.splitlines()
        if ": error: " in line
    )
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

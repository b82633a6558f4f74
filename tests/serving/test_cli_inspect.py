"""`retrieval-host corpora` and `sources list|show` against a real host over TLS."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.serving.cli import main
from tests.support.host import CORPUS, HANDBOOK, RunningHost, World, build_world, serve_in_thread


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("cli-inspect"), local_embedding)
    yield world
    world.close()


@pytest.fixture(scope="module")
def host(world: World) -> Iterator[RunningHost]:
    with serve_in_thread(world.settings(), world.driver, world.tls) as running:
        yield running


def _env(world: World, token: str, host: RunningHost) -> dict[str, str]:
    return {"RETRIEVAL_HOST_TOKEN": world.tokens[token], "RETRIEVAL_HOST_URL": host.base_url}


def test_corpora_lists_what_the_token_may_search(
    host: RunningHost, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = str(world.tls.ca_file)
    assert main(["corpora", "--ca-bundle", ca, "--json"], environ=_env(world, "alice", host)) == 0
    [line] = capsys.readouterr().out.splitlines()
    corpus = json.loads(line)
    assert (corpus["id"], corpus["sources"], corpus["passages"]) == (CORPUS, 1, len(HANDBOOK))
    assert corpus["writeOnly"] is False
    assert main(["corpora", "--ca-bundle", ca], environ=_env(world, "admin", host)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{CORPUS}  version passages-v1  2 sources  ")
    # A writer's token learns where it may write (it was shown nothing).
    assert main(["corpora", "--ca-bundle", ca], environ=_env(world, "scribe", host)) == 0
    assert capsys.readouterr().out == f"{CORPUS}  [index]  (may not search)\n"
    # As JSON, it says which list it came from (probe "cli", session 43).
    assert main(["corpora", "--ca-bundle", ca, "--json"], environ=_env(world, "scribe", host)) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"id": CORPUS, "operations": ["index"], "writeOnly": True}


def test_sources_list_and_show(
    host: RunningHost, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = str(world.tls.ca_file)
    env = _env(world, "admin", host)
    assert (
        main(["sources", "list", CORPUS, "--page-size", "1", "--ca-bundle", ca], environ=env) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["handbook", "r1", str(len(HANDBOOK))],
        ["secret", "r1", "1"],
    ]
    assert main(["sources", "show", CORPUS, "handbook", "--ca-bundle", ca], environ=env) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "handbook  revision r1  The handbook"
    assert [line.split()[0] for line in shown[2:]] == [f"handbook-{i}" for i in range(3)]
    assert "page 1 lines 2" in shown[3]


def test_errors_are_one_line_without_a_traceback(
    host: RunningHost, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = str(world.tls.ca_file)
    argv = ["sources", "show", CORPUS, "secret", "--ca-bundle", ca]
    assert main(argv, environ=_env(world, "alice", host)) == 1
    assert "SOURCE_UNAVAILABLE" in capsys.readouterr().err
    assert main(["corpora"], environ={}) == 2
    assert "RETRIEVAL_HOST_URL" in capsys.readouterr().err
    assert main(["corpora", "--url", host.base_url], environ={}) == 2
    assert "RETRIEVAL_HOST_TOKEN" in capsys.readouterr().err
    # Argument mistakes are argparse's usage errors (exit 2); from a black-box probe: a page
    # size out of range was a pydantic dump, a missing CA file a FileNotFoundError traceback.
    for size in ("5000", "0"):
        with pytest.raises(SystemExit) as exited:
            main(["sources", "list", CORPUS, "--page-size", size, "--ca-bundle", ca])
        assert exited.value.code == 2
        assert "1..1000" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["corpora", "--ca-bundle", "/nonexistent.pem"])
    assert exited.value.code == 2
    refused = capsys.readouterr().err
    assert "cannot read /nonexistent.pem" in refused and "Traceback" not in refused
    # A file that holds no certificate was an ssl.SSLError traceback (a black-box test).
    not_pem = Path(ca).with_name("not-a-cert.pem")
    not_pem.write_text("garbage\n")
    assert main(["corpora", "--ca-bundle", str(not_pem)], environ=_env(world, "alice", host)) == 2
    refused = capsys.readouterr().err
    assert "is not a PEM certificate file" in refused and "Traceback" not in refused
    # The two connection failures a newcomer meets first say what to try (a black-box test).
    plain = {**_env(world, "alice", host), "RETRIEVAL_HOST_URL": f"http://127.0.0.1:{host.port}"}
    assert main(["corpora", "--ca-bundle", ca], environ=plain) == 1
    assert "give an https:// URL" in capsys.readouterr().err
    assert main(["corpora"], environ=_env(world, "alice", host)) == 1
    unverified = capsys.readouterr().err
    assert "CERTIFICATE_VERIFY_FAILED" in unverified and "pass --ca-bundle" in unverified


def test_a_reader_that_leaves_early_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `retrieval-host sources list ... | head -1` ended in a BrokenPipeError traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    broken = os.fdopen(write_end, "w", buffering=1)  # line-buffered: print writes at once
    monkeypatch.setattr(sys, "stdout", broken)
    try:
        assert main(["token", "new", "--subject", "s", "--search", "library"]) == 141
    finally:
        monkeypatch.undo()
        broken.close()

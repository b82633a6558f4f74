"""`retrieval-host ingest FOLDER` reads the files it listed, or none: a writer of the folder who
swaps a listed file (or a folder above it) for a link, or a file for a FIFO, after the listing
gets it skipped with the reason, not read (probe S: the link brought in a file from outside the
folder; the FIFO hung the command in open(), past SIGTERM, until a writer came)."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from retrieval_host.ingest.settings import media_type_for_path
from retrieval_host.serving.ingest_cli import run_ingest

REPO = Path(__file__).resolve().parents[2]
SECRET = "TOP SECRET payroll figure: 987654 for the board only."


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The example host file, an ACL letting `ops` index everything, the store in tmp."""
    shutil.copy(REPO / "config" / "host.example.json", tmp_path / "host.json")
    acl = {"subjects": {"ops": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    (tmp_path / "state").mkdir(mode=0o700)
    environ = {
        "RETRIEVAL_HOST_STORE__SQLITE_PATH": str(tmp_path / "state" / "store" / "r.sqlite"),
        "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "acl.json"}),
    }
    return tmp_path / "host.json", environ


def _swap_before_reading(
    monkeypatch: pytest.MonkeyPatch, victim: Path, swap: Callable[[], None]
) -> list[Path]:
    """Run `swap` when the batch takes `victim` up, after the listing and before its read:
    the batch asks each file's media type first. Returns the paths swapped (one, or none)."""
    swapped: list[Path] = []

    def media_type_then_swap(path: Path) -> str:
        if path == victim and not swapped:
            swap()
            swapped.append(path)
        return media_type_for_path(path)

    monkeypatch.setattr("retrieval_host.batch.media_type_for_path", media_type_then_swap)
    return swapped


def _ingest(config: Path, environ: dict[str, str], journal: Path, path: Path) -> tuple[int, str]:
    args = argparse.Namespace(
        paths=[path], config=config, corpus="library", subject="ops", journal=journal
    )
    out, err = io.StringIO(), io.StringIO()
    code = run_ingest(args, environ, out, err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue()


def _stored_bytes(environ: dict[str, str]) -> bytes:
    """Every byte of the store's files (the database and its journal files)."""
    store = Path(environ["RETRIEVAL_HOST_STORE__SQLITE_PATH"]).parent
    return b"".join(path.read_bytes() for path in sorted(store.iterdir()) if path.is_file())


def _journaled(journal: Path) -> list[str]:
    return sorted(json.loads(line)["sourceId"] for line in journal.read_text().splitlines())


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_listed_file_swapped_for_a_link_to_an_outside_file_is_skipped_not_indexed(
    setup: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
) -> None:
    config, environ = setup
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.md").write_text(f"# Outside\n\n{SECRET}\n")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    victim = folder / "sub" / "victim.md"
    victim.write_text("# Rota\n\nRoutine note about the weekly rota.\n")

    def swap() -> None:
        if what == "file":
            victim.unlink()
            victim.symlink_to(outside / "victim.md")
        else:  # the folder above it: a link to an outside folder holding a file of that name
            (folder / "sub").rename(tmp_path / "moved-away")
            (folder / "sub").symlink_to(outside, target_is_directory=True)

    swapped = _swap_before_reading(monkeypatch, victim, swap)
    journal = tmp_path / "j.jsonl"
    code, out = _ingest(config, environ, journal, folder)
    assert swapped == [victim]
    stored = _stored_bytes(environ)
    assert b"The ferry leaves at nine." in stored  # the check below can see passage text
    assert b"payroll" not in stored
    assert code == 0, out
    lines = out.splitlines()
    assert "skipped   sub/victim.md  changed since it was listed" in lines, lines
    assert lines[-1].startswith("1 indexed, 0 unchanged, 1 skipped, 0 failed"), lines
    assert _journaled(journal) == ["note.md"]


def test_a_link_named_on_the_command_line_is_still_taken_as_given(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    (tmp_path / "real.md").write_text("# Real\n\nThe ferry leaves at nine.\n")
    (tmp_path / "named.md").symlink_to(tmp_path / "real.md")
    code, out = _ingest(config, environ, tmp_path / "j.jsonl", tmp_path / "named.md")
    assert code == 0, out
    assert out.splitlines()[0].startswith("indexed   named.md  1 passages"), out


def _ingest_unless_it_hangs(
    config: Path, environ: dict[str, str], journal: Path, path: Path, fifo: Path
) -> tuple[int, str]:
    """The command, bounded: if it has not returned in two minutes it waits in open() on the
    FIFO, and the test fails (after opening the FIFO for writing once, to set it free)."""
    ended: list[tuple[int, str]] = []
    command = threading.Thread(
        target=lambda: ended.append(_ingest(config, environ, journal, path)), daemon=True
    )
    command.start()
    command.join(timeout=120)
    if command.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader waiting: succeeds
        command.join(timeout=120)
        pytest.fail("the ingest command waited for a writer of the FIFO")
    assert ended, "the command raised (its traceback is above)"
    return ended[0]


def test_a_listed_file_swapped_for_a_fifo_is_skipped_and_the_command_does_not_hang(
    setup: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, environ = setup
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    victim = folder / "victim.md"
    victim.write_text("# Rota\n\nRoutine note about the weekly rota.\n")

    def swap() -> None:
        victim.unlink()
        os.mkfifo(victim)  # no writer ever opens it

    swapped = _swap_before_reading(monkeypatch, victim, swap)
    journal = tmp_path / "j.jsonl"
    code, out = _ingest_unless_it_hangs(config, environ, journal, folder, victim)
    assert swapped == [victim]
    assert code == 0, out
    lines = out.splitlines()
    assert "skipped   victim.md  not a regular file" in lines, lines
    assert lines[-1].startswith("1 indexed, 0 unchanged, 1 skipped, 0 failed"), lines
    assert _journaled(journal) == ["note.md"]


def test_a_fifo_named_on_the_command_line_is_skipped_not_waited_on(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    code, out = _ingest_unless_it_hangs(config, environ, tmp_path / "j.jsonl", fifo, fifo)
    assert code == 0, out
    assert out.splitlines()[0] == "skipped   pipe.md  not a regular file", out

"""`retrieval-host ingest`: set-aside files with their reasons, "no such file", the locked
journal, and progress bars on a terminal (rich) with a passage count per file."""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

from retrieval_host.batch import BatchItem
from retrieval_host.serving.ingest_cli import _Bars, run_ingest

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "server" / "retrieval_host" / "samples"


class Terminal(io.StringIO):
    """Captured output that says it is a terminal, so the command draws its bars."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The example host file, an ACL letting `ops` index everything, the store in tmp."""
    shutil.copy(REPO / "config" / "host.example.json", tmp_path / "host.json")
    acl = {"subjects": {"ops": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    environ = {
        "RETRIEVAL_HOST_STORE__SQLITE_PATH": str(state / "store" / "retrieval.sqlite"),
        "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "acl.json"}),
    }
    return tmp_path / "host.json", environ


def _args(config: Path, journal: Path, *paths: Path) -> argparse.Namespace:
    return argparse.Namespace(
        paths=list(paths), config=config, corpus="library", subject="ops", journal=journal
    )


def test_files_the_host_cannot_take_are_listed_with_their_reason(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    (folder / "scan.docx").write_bytes(b"PK\x03\x04")
    with (folder / "huge.md").open("wb") as huge:  # sparse: over the 32 MiB limit, never read
        huge.truncate(32 * 1024 * 1024 + 1)
    out, err = io.StringIO(), io.StringIO()
    code = run_ingest(_args(config, tmp_path / "j.jsonl", folder), environ, out, err)
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("indexed   note.md  1 passages")
    assert f"skipped   {folder / 'scan.docx'}  unsupported type (.docx)" in lines
    assert any(line.startswith(f"skipped   {folder / 'huge.md'}  too large (") for line in lines)
    assert lines[-1].startswith("1 indexed, 0 unchanged, 2 skipped, 0 failed")


def test_a_missing_path_says_no_such_file_and_ingests_nothing(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe ferry leaves at nine.\n")
    out, err = io.StringIO(), io.StringIO()
    journal = tmp_path / "j.jsonl"
    code = run_ingest(_args(config, journal, note, tmp_path / "nope.md"), environ, out, err)
    assert code == 2
    assert err.getvalue() == f"retrieval-host: no such file: {tmp_path / 'nope.md'}\n"
    assert out.getvalue() == ""
    assert not journal.exists()


def test_a_journal_in_use_by_another_run_is_refused(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe ferry leaves at nine.\n")
    journal = tmp_path / "j.jsonl"
    # Another run holds the journal (the lock is the one a run takes: flock, exclusive).
    held = os.open(journal, os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        out, err = io.StringIO(), io.StringIO()
        assert run_ingest(_args(config, journal, note), environ, out, err) == 2
        assert f"the journal {journal} is in use by another ingest run" in err.getvalue()
        assert journal.read_text() == ""
    finally:
        os.close(held)
    out = io.StringIO()
    assert run_ingest(_args(config, journal, note), environ, out, io.StringIO()) == 0
    assert "1 indexed" in out.getvalue()


def test_on_a_terminal_the_bars_follow_files_and_passages(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    out, err = io.StringIO(), Terminal()
    code = run_ingest(_args(config, tmp_path / "j.jsonl", SAMPLES), environ, out, err)
    assert code == 0, err.getvalue()
    drawn = err.getvalue()
    assert "\x1b[" in drawn  # drawn as a live terminal display
    assert drawn.count("indexed ") == 3  # each file's line, printed above the bars
    assert out.getvalue().startswith("3 indexed, 0 unchanged, 0 skipped, 0 failed")


def test_the_passage_bar_shows_the_phase_and_the_count() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with Progress(console=console, auto_refresh=False) as progress:
        bars = _Bars(progress, files=2)
        bars.passages("embed", 64, 400)
        progress.refresh()
        assert "embedding" in screen.getvalue()
        assert "16%" in screen.getvalue()  # 64 of 400
        bars.finished(BatchItem("a.md", "a.md", "indexed", "r1", 400))
        progress.refresh()
    assert "indexed   a.md  400 passages" in screen.getvalue()


def test_a_file_without_progress_within_the_idle_timeout_fails_alone_and_a_rerun_takes_it(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    config, environ = setup
    folder = tmp_path / "docs"
    folder.mkdir()
    # About 200 passages: parsing alone takes far longer than a millisecond without progress.
    steps = "\n\n".join(
        f"## Step {i}\n\nCheck valve {i} for wear, then log gauge {i}." * 3 for i in range(200)
    )
    (folder / "a-valves.md").write_text(f"# Valves\n\n{steps}\n")  # first in the batch
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    journal = tmp_path / "j.jsonl"
    args = _args(config, journal, folder)
    args.idle_timeout_ms = 1
    out, err = io.StringIO(), io.StringIO()
    assert run_ingest(args, environ, out, err) == 1, err.getvalue()  # 1: a file failed
    lines = out.getvalue().splitlines()
    # The stalled file fails with the typed timeout, alone: the batch goes on with the note
    # (on its own clock; fast enough or not, it is reported).
    assert any(
        line.startswith("failed") and "a-valves.md" in line and "TIMEOUT" in line for line in lines
    ), lines
    assert any("note.md" in line for line in lines), lines
    assert "TIMEOUT" in journal.read_text()
    # Without the timeout, a rerun of the same journal indexes both.
    out = io.StringIO()
    assert run_ingest(_args(config, journal, folder), environ, out, io.StringIO()) == 0
    rerun = out.getvalue().splitlines()
    assert ", 0 failed" in rerun[-1], rerun
    assert any(line.startswith("indexed") and "a-valves.md" in line for line in rerun), rerun
    args.idle_timeout_ms = 0
    refused = io.StringIO()
    assert run_ingest(args, environ, io.StringIO(), refused) == 2
    assert "--idle-timeout-ms must be a positive number" in refused.getvalue()

"""`retrieval-host ingest`: set-aside files with their reasons (links in a folder too), "no such
file" and the other mistakes as one line and exit 2, the locked journal, progress bars on a
terminal (rich) with a passage count per file, and Ctrl-C: the files in flight stop before
their commit, the counts are printed, exit 130, and a rerun resumes."""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import apsw
import pytest
from rich.console import Console
from rich.progress import Progress

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.batch import BatchItem
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.serving.cli import main
from retrieval_host.serving.factory import build_driver
from retrieval_host.serving.ingest_cli import _Bars, plan_files, run_ingest
from retrieval_host.settings import SettingsError, load_settings
from tests.support.ingest_cli_child import HOLD
from tests.support.previous_vector_store import sqlite_v2_database
from tests.support.run_records import SQLITE_RUNS_SCHEMA_V3, old_database

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
    (folder / "blank.md").write_text("   \n\n")
    with (folder / "huge.md").open("wb") as huge:  # sparse: over the 32 MiB limit, never read
        huge.truncate(32 * 1024 * 1024 + 1)
    out, err = io.StringIO(), io.StringIO()
    code = run_ingest(_args(config, tmp_path / "j.jsonl", folder), environ, out, err)
    assert code == 1, err.getvalue()  # 1: a file failed
    lines = out.getvalue().splitlines()
    assert any(line.startswith("indexed   note.md  1 passages") for line in lines), lines
    assert f"skipped   {folder / 'scan.docx'}  unsupported type (.docx)" in lines
    assert any(line.startswith(f"skipped   {folder / 'huge.md'}  too large (") for line in lines)
    # A failure in the host's own words (a black-box test: `failed blank2001.pdf
    # PAYLOAD_TOO_LARGE pages` did not say the limit).
    assert "failed    blank.md  INVALID_DOCUMENT empty-document: the document is empty." in lines
    assert lines[-1].startswith("1 indexed, 0 unchanged, 2 skipped, 1 failed")


def test_a_batch_ingest_needs_no_generation_providers_key(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    # A black-box test: with an openai provider whose key comes from the environment, the
    # batch ingest (which makes no run) refused to start without the production model's key.
    config, environ = setup
    host = json.loads(config.read_text())
    host["providers"] = {
        "model": {"kind": "openai", "baseUrl": "https://llm.example", "apiKey": {"env": "LLM"}}
    }
    config.write_text(json.dumps(host))
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    out, err = io.StringIO(), io.StringIO()
    code = run_ingest(_args(config, tmp_path / "j.jsonl", folder), environ, out, err)
    assert "LLM" not in err.getvalue()
    assert code == 0, err.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("1 indexed")
    # `serve` still refuses to start without it: a host that runs needs its key at once.
    with pytest.raises(SettingsError, match="LLM is not set"):
        build_driver(load_settings(config, environ), environ)


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


def test_a_read_only_store_is_named_as_what_to_change_not_a_journal_to_rerun(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    # Probe R: "rerun with the journal to resume" against a store no rerun could write.
    config, environ = setup
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe ferry leaves at nine.\n")
    assert (
        run_ingest(_args(config, tmp_path / "j.jsonl", note), environ, io.StringIO(), io.StringIO())
        == 0
    )
    note.write_text("# Note\n\nThe ferry leaves at ten.\n")
    read_only = {
        **environ,
        "RETRIEVAL_HOST_STORE__READ_ONLY": "true",
        "RETRIEVAL_HOST_RUNS__SQLITE_PATH": str(tmp_path / "runs.db"),
    }
    err = io.StringIO()
    code = run_ingest(_args(config, tmp_path / "k.jsonl", note), read_only, io.StringIO(), err)
    assert code == 2, err.getvalue()
    assert "STORE_READ_ONLY" in err.getvalue() and "point --config at the writable store" in (
        err.getvalue()
    )
    assert "rerun with the journal" not in err.getvalue()


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


def _argv(config: Path, journal: Path, *paths: Path, corpus: str = "library") -> list[str]:
    return [
        "ingest", *map(str, paths), "--config", str(config), "--corpus", corpus,
        "--subject", "ops", "--journal", str(journal),
    ]  # fmt: skip


def test_links_in_a_folder_are_listed_with_their_reason_and_the_other_files_ingested(
    setup: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, environ = setup
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("not part of the folder\n")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    (folder / "out.txt").symlink_to(outside / "secret.txt")
    (folder / "again.md").symlink_to("note.md")
    (folder / "dir").symlink_to(outside, target_is_directory=True)
    (folder / "gone.md").symlink_to("nowhere.md")
    journal = tmp_path / "j.jsonl"
    assert main(_argv(config, journal, folder), environ=environ) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.out.splitlines()
    assert lines[0].startswith("indexed   note.md  1 passages")
    assert f"skipped   {folder / 'out.txt'}  a link to a file outside the folder" in lines
    assert f"skipped   {folder / 'dir'}  a link to a folder outside the folder" in lines
    assert f"skipped   {folder / 'gone.md'}  a broken link" in lines
    assert (
        f"skipped   {folder / 'again.md'}  a link to note.md in the folder (links are not followed)"
        in lines
    )
    assert lines[-1].startswith("1 indexed, 0 unchanged, 4 skipped, 0 failed")
    assert [json.loads(line)["sourceId"] for line in journal.read_text().splitlines()] == [
        "note.md"
    ]


def test_a_file_named_twice_is_planned_once_and_a_named_link_is_taken() -> None:
    note = SAMPLES / "operator-guide.md"
    plan = plan_files([note, Path(os.path.relpath(note)), SAMPLES])
    assert plan.files.count(note) == 1
    assert len(plan.files) == len({path.resolve() for path in plan.files})
    assert plan.root is None  # several paths: source ids are file names


NOT_UTF8 = os.fsdecode(b"caf\xe9.md")  # a Latin-1 name, as Python reads it from the disk


@pytest.mark.parametrize("mistake", ["corpus", "subject", "one-id", "journal-folder", "not-utf8"])
def test_ordinary_mistakes_are_one_line_and_exit_2_before_anything_is_ingested(
    setup: tuple[Path, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mistake: str,
) -> None:
    config, environ = setup
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "doc.md").write_text(f"# Doc {name}\n\nText {name}.\n")
    journal = tmp_path / "j.jsonl"
    argv = _argv(config, journal, tmp_path / "a")
    expected = {
        "corpus": "retrieval-host: this host has no corpus 'nope' (its corpora: library)",
        "subject": "retrieval-host: subject 'nobody' may not index into corpus 'library' "
        "(PERMISSION_DENIED: This operation is not permitted.)",
        "one-id": f"retrieval-host: {tmp_path / 'a' / 'doc.md'} and {tmp_path / 'b' / 'doc.md'} "
        "would both be source id 'doc.md'",
        "journal-folder": f"retrieval-host: the journal's folder {tmp_path / 'no-such-dir'} "
        "does not exist",
        # A name that is not UTF-8 stopped the batch as "could not be parsed" and a rerun
        # met it again (a black-box test).
        "not-utf8": "retrieval-host: nothing was ingested: INVALID_REQUEST: "
        f"{str(tmp_path / 'a' / NOT_UTF8)!r} has no usable source id",
    }[mistake]
    if mistake == "not-utf8":
        (tmp_path / "a" / NOT_UTF8).write_text("# Caf\n\nText.\n")
    if mistake == "corpus":
        argv = _argv(config, journal, tmp_path / "a", corpus="nope")
    elif mistake == "subject":
        argv[argv.index("ops")] = "nobody"
    elif mistake == "one-id":
        argv = _argv(config, journal, tmp_path / "a", tmp_path / "b")
    elif mistake == "journal-folder":
        argv = _argv(config, tmp_path / "no-such-dir" / "j.jsonl", tmp_path / "a")
    assert main(argv, environ=environ) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(expected), captured.err
    assert len(captured.err.splitlines()) == 1  # one line, no traceback
    assert "Traceback" not in captured.out
    assert not journal.exists() or journal.read_text() == ""


def _folder_with_held_files(root: Path) -> Path:
    """Two files that index at once, then six whose embedding the child holds (`HOLD`)."""
    folder = root / "docs"
    folder.mkdir()
    for n in (1, 2):
        (folder / f"a{n}.md").write_text(f"# Quick {n}\n\nThe ferry {n} leaves at nine.\n")
    for n in range(1, 7):
        (folder / f"h{n}.md").write_text(f"# Held {n}\n\nThe crane {n} is {HOLD}.\n")
    return folder


def _start_held(
    config: Path, environ: dict[str, str], journal: Path, folder: Path, mode: str
) -> tuple[subprocess.Popen[bytes], int]:
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.ingest_cli_child", str(write_fd), mode,
         *_argv(config, journal, folder)],
        cwd=REPO, env={**os.environ, **environ}, pass_fds=(write_fd,),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(write_fd)
    return child, read_fd


def _read_until(fd: int, wanted: bytes, count: int, child: subprocess.Popen[bytes]) -> None:
    """Block on `fd` (a pipe) until `wanted` was read `count` times: an event, not a poll."""
    seen = b""
    deadline = time.monotonic() + 180  # the child loads the model and indexes two files
    while seen.count(wanted) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"no {wanted!r} x{count} (read {seen!r}): {err.decode()[-3000:]}")
        seen += chunk


def _journaled(journal: Path) -> list[tuple[str, str]]:
    lines = journal.read_text().splitlines()
    return sorted((json.loads(line)["sourceId"], json.loads(line)["status"]) for line in lines)


def _resume(
    config: Path, environ: dict[str, str], journal: Path, folder: Path,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:  # fmt: skip
    """A rerun of the journal, without holds: what the first run committed is `skipped`; a
    file that committed without its journal line would come back `unchanged`."""
    assert main(_argv(config, journal, folder), environ=environ) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    "interrupt",
    [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
    ids=["ctrl-c", "sigterm", "sighup"],
)
def test_ctrl_c_stops_the_files_in_flight_before_their_commit_reports_and_resumes(
    setup: tuple[Path, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    interrupt: signal.Signals,
) -> None:
    config, environ = setup
    folder = _folder_with_held_files(tmp_path)
    journal = tmp_path / "j.jsonl"
    child, held = _start_held(config, environ, journal, folder, "cancellable")
    try:
        # Four files in flight (the default), all held: a1 and a2 are done (journaled before
        # h3 and h4 could start), h1-h4 are embedding.
        _read_until(held, b"held\n", 4, child)
        assert _journaled(journal) == [("a1.md", "indexed"), ("a2.md", "indexed")]
        child.send_signal(interrupt)
        # Before the fix the held files never heard of the interrupt: this timed out (and
        # SIGTERM ended the command at once, printing nothing).
        out, err = child.communicate(timeout=60)
    finally:
        os.close(held)
        child.kill()
    assert child.returncode == 130, err.decode()[-3000:]
    lines = out.decode().splitlines()
    assert sorted(lines[:2]) == ["indexed   a1.md  1 passages", "indexed   a2.md  1 passages"]
    assert sorted(lines[2:6]) == [
        f"cancelled h{n}.md  stopped before its commit" for n in range(1, 5)
    ]
    assert lines[6:] == [
        f"2 indexed, 0 unchanged, 0 skipped, 0 failed, 6 cancelled (journal: {journal})"
    ]
    assert err.decode().splitlines() == [
        "retrieval-host: cancelling: no further file starts and the files in flight stop "
        "before their commit (Ctrl-C again quits at once)",
        f"retrieval-host: cancelled: 4 files stopped before their commit, 2 not started; "
        f"rerun with the journal {journal} to resume",
    ]
    assert _journaled(journal) == [("a1.md", "indexed"), ("a2.md", "indexed")]
    rerun = _resume(config, environ, journal, folder, capsys)
    assert rerun[-1].startswith("6 indexed, 0 unchanged, 2 skipped, 0 failed"), rerun


def test_a_second_sighup_only_cancels_again(
    setup: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A closing terminal often sends SIGHUP twice (the hangup, then the shell's): the second
    one quit at once, as a second Ctrl-C does. Now only Ctrl-C escalates."""
    config, environ = setup
    folder = _folder_with_held_files(tmp_path)
    journal = tmp_path / "j.jsonl"
    # Files that ignore their cancel token: the batch stays cancelling until told to quit.
    child, held = _start_held(config, environ, journal, folder, "stuck")
    assert child.stderr is not None
    try:
        _read_until(held, b"held\n", 4, child)
        child.send_signal(signal.SIGHUP)
        _read_until(child.stderr.fileno(), b"retrieval-host: cancelling", 1, child)
        child.send_signal(signal.SIGHUP)
        _read_until(child.stderr.fileno(), b"retrieval-host: still cancelling", 1, child)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        os.close(held)
        child.kill()
    assert child.returncode == 130, err.decode()[-3000:]
    assert err.decode().endswith("retrieval-host: interrupted again: quitting at once\n")


def test_a_second_ctrl_c_quits_at_once_when_the_files_in_flight_do_not_stop(
    setup: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, environ = setup
    folder = _folder_with_held_files(tmp_path)
    journal = tmp_path / "j.jsonl"
    child, held = _start_held(config, environ, journal, folder, "stuck")
    assert child.stderr is not None
    try:
        _read_until(held, b"held\n", 4, child)
        child.send_signal(signal.SIGINT)
        _read_until(child.stderr.fileno(), b"retrieval-host: cancelling", 1, child)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        os.close(held)
        child.kill()
    assert child.returncode == 130
    # What finished before the interrupts was printed before the quit.
    assert sorted(out.decode().splitlines()) == [
        "indexed   a1.md  1 passages",
        "indexed   a2.md  1 passages",
    ]
    assert err.decode().endswith("retrieval-host: interrupted again: quitting at once\n")
    assert "Traceback" not in err.decode()
    assert _journaled(journal) == [("a1.md", "indexed"), ("a2.md", "indexed")]
    rerun = _resume(config, environ, journal, folder, capsys)
    assert rerun[-1].startswith("6 indexed, 0 unchanged, 2 skipped, 0 failed"), rerun


def test_the_default_journal_of_a_corpus_id_with_a_slash_is_one_file_here(
    setup: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box test: `--corpus team/a` named a journal in a folder `.retrieval-host-ingest-team`
    # that did not exist (and `..` in an id would have walked out of the working directory).
    config, environ = setup
    environ = {
        **environ,
        "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps(
            {"aclFile": "acl.json", "corpora": ["team/a"]}
        ),
    }
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe ferry leaves at nine.\n")
    monkeypatch.chdir(tmp_path)
    args = _args(config, note, note)
    args.corpus, args.journal = "team/a", None
    out, err = io.StringIO(), io.StringIO()
    assert run_ingest(args, environ, out, err) == 0, err.getvalue()
    assert (tmp_path / ".retrieval-host-ingest-team%2Fa.jsonl").is_file()


@pytest.mark.parametrize("old", ["vector-store", "run-store"])
def test_the_ingest_command_never_migrates_a_store_of_an_earlier_release(
    setup: tuple[Path, dict[str, str]],
    tmp_path: Path,
    local_embedding: LocalEmbedding,
    capsys: pytest.CaptureFixture[str],
    old: str,
) -> None:
    # A black-box test: this release's `ingest`, run from an operator's updated venv beside
    # the earlier host still serving the store, migrated both files, even with nothing to
    # ingest; the earlier host then failed its next start (`UNSAFE_STORE`).
    config, environ = setup
    store_dir = Path(environ["RETRIEVAL_HOST_STORE__SQLITE_PATH"]).parent
    store_dir.mkdir(mode=0o700)
    vectors, runs = store_dir / "retrieval.sqlite", store_dir / "runs.db"
    if old == "vector-store":
        described = CorpusDescriptor("library", "passages-v1", local_embedding.descriptor)
        sqlite_v2_database(vectors, described, {("docs", "old"): ["An old passage."]})
    else:
        old_database(runs, SQLITE_RUNS_SCHEMA_V3, 3)
        host = json.loads(config.read_text())  # a provider: the driver opens run records
        host["providers"] = {"local": {"kind": "extractive"}}
        config.write_text(json.dumps(host))
    path = vectors if old == "vector-store" else runs
    before = apsw.Connection(str(path)).execute("PRAGMA user_version").fetchall()
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\n\nThe ferry leaves at nine.\n")
    assert main(_argv(config, tmp_path / "j.jsonl", folder), environ=environ) == 2
    said = capsys.readouterr().err
    assert "start the host of this release first" in said, said
    assert apsw.Connection(str(path)).execute("PRAGMA user_version").fetchall() == before
    assert before in ([(2,)], [(3,)])  # an earlier release's
    if old == "run-store":
        # Refused before the vector store was touched: a corpus it created there (a black-box
        # test) had an analyzer the earlier host could not open.
        assert not vectors.exists()

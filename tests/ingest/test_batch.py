"""Batch ingestion: journal, resume after SIGKILL without duplicates, cancel between files and
of the files in flight (also by KeyboardInterrupt), one ingest per file named twice."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.batch import DEFAULT_IN_FLIGHT, JournalError, ingest_paths
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.driver import Driver
from retrieval_host.serving.cli import main
from tests.support import ingest_documents as docs
from tests.support.ingest_driver import (
    CORPUS,
    NAMESPACE,
    Host,
    context,
    dump_index,
    make_host,
    sources,
)

REPO = Path(__file__).resolve().parents[2]
TOPICS = ["ferries", "cranes", "moorings", "lighthouses", "tides", "customs"]


def write_corpus(root: Path) -> list[Path]:
    """Six files of three types, each worth a dozen passages of embedding work."""
    files: list[Path] = []
    for n, topic in enumerate(TOPICS):
        lines = [
            f"Rule {i} for {topic}: every {topic[:-1]} inspection {i} is logged with the "
            f"harbour office, signed by the duty officer and kept for {i + n} years."
            for i in range(30)
        ]
        if n < 3:
            path = root / "guides" / f"{topic}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {topic.title()}\n\n" + "\n".join(lines) + "\n")
        elif n < 5:
            path = root / "manuals" / f"{topic}.pdf"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(docs.text_pdf([lines[:15], lines[15:]]))
        else:
            path = root / "mail" / f"{topic}.mbox"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(
                docs.mbox(
                    docs.message("\n".join(lines[:15]) + "\n", message_id="<c1@example.org>"),
                    docs.message("\n".join(lines[15:]) + "\n", message_id="<c2@example.org>"),
                )
            )
        files.append(path)
    return files


def source_ids(root: Path, files: list[Path]) -> list[str]:
    return [f.relative_to(root).as_posix() for f in files]


def completed_ids(journal: Path) -> set[str]:
    if not journal.exists():
        return set()
    done: set[str] = set()
    for line in journal.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("status") in ("indexed", "unchanged"):
            done.add(entry["sourceId"])
    return done


def completed(journal: Path) -> int:
    return len(completed_ids(journal))


def test_a_killed_batch_resumes_to_the_same_index_as_a_clean_run(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)
    ids = source_ids(root, files)
    db = tmp_path / "resumed" / "index.db"
    journal = tmp_path / "journal.jsonl"

    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.ingest_batch_child", str(db), str(journal),
         str(root), *map(str, files)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while child.poll() is None and completed(journal) < 1 and time.monotonic() < deadline:
        time.sleep(0.002)  # polling the journal: the kill must land right after a file
    child.send_signal(signal.SIGKILL)
    _, stderr = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    done_ids = completed_ids(journal)
    done_at_kill = len(done_ids)
    assert 1 <= done_at_kill < len(files), "the kill must land mid-way"

    resumed = make_host(db, local_embedding)
    try:
        report = ingest_paths(
            resumed.driver, CORPUS, files, context(), journal_path=journal, root=root
        )
        statuses = [item.status for item in report.items]
        # Files finish out of order (several are in flight): what the journal held is skipped.
        assert [i.source_id for i in report.items if i.status == "skipped"] == [
            i.source_id for i in report.items if i.source_id in done_ids
        ]
        assert statuses.count("skipped") == done_at_kill
        assert set(statuses) - {"skipped"} <= {"indexed", "unchanged"}
        # At most the files in flight at the kill committed without their journal line.
        assert statuses.count("unchanged") <= DEFAULT_IN_FLIGHT
        assert not report.cancelled
        resumed_rows = dump_index(resumed, ids)
        resumed_sources = sources(resumed, ids)
    finally:
        resumed.store.close()

    clean = make_host(tmp_path / "clean" / "index.db", local_embedding)
    try:
        clean_report = ingest_paths(
            clean.driver, CORPUS, files, context(), journal_path=tmp_path / "clean.jsonl",
            root=root,
        )  # fmt: skip
        assert [item.status for item in clean_report.items] == ["indexed"] * len(files)
        clean_rows = dump_index(clean, ids)
        assert sources(clean, ids) == resumed_sources
    finally:
        clean.store.close()

    assert len(resumed_sources) == len(files)
    assert len(clean_rows) == sum(count for _, count, _ in resumed_sources.values())
    assert resumed_rows == clean_rows  # chunk for chunk: ids, texts, locations, revisions


def test_a_rerun_after_completion_skips_everything(
    tmp_path: Path, host: Host, local_embedding: LocalEmbedding
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)[:3]
    journal = tmp_path / "journal.jsonl"
    seen: list[tuple[int, int]] = []
    first = ingest_paths(
        host.driver, CORPUS, files, context(), journal_path=journal, root=root,
        progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert [i.status for i in first.items] == ["indexed"] * 3
    assert [i.source_id for i in first.items] == source_ids(root, files)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    calls = host.embedding.embed_calls
    with journal.open("a") as torn:
        torn.write('{"v": 1, "corpus": "handbook", "sta')  # a crash mid-write
    again = ingest_paths(host.driver, CORPUS, files, context(), journal_path=journal, root=root)
    assert [i.status for i in again.items] == ["skipped"] * 3
    assert host.embedding.embed_calls == calls
    for line in journal.read_text().splitlines()[:3]:
        assert json.loads(line)["status"] == "indexed"


def test_a_journal_reused_against_another_store_ingests_instead_of_skipping(
    tmp_path: Path, host: Host, local_embedding: LocalEmbedding
) -> None:
    # A black-box test: rerunning a journal against a new store (a new database, a restored
    # backup, a corpus rebuilt for a new analyzer) skipped every file, said `0 indexed` and
    # exited 0, leaving the new store empty.
    root = tmp_path / "docs"
    files = write_corpus(root)[:3]
    journal = tmp_path / "journal.jsonl"
    ingest_paths(host.driver, CORPUS, files, context(), journal_path=journal, root=root)
    other = make_host(tmp_path / "other" / "index.db", local_embedding)
    try:
        moved = ingest_paths(
            other.driver, CORPUS, files, context(), journal_path=journal, root=root
        )
        assert [i.status for i in moved.items] == ["indexed"] * 3
        ids = source_ids(root, files)
        assert sources(other, ids) == sources(host, ids) and len(sources(host, ids)) == 3
        # A source deleted from the first store since is ingested again too; the rest skip.
        first = moved.items[0]
        assert first.revision is not None
        host.store.delete_source(CORPUS, NAMESPACE, first.source_id, first.revision)
        again = ingest_paths(host.driver, CORPUS, files, context(), journal_path=journal, root=root)
        assert [i.status for i in again.items] == ["indexed", "skipped", "skipped"]
    finally:
        other.store.close()


def test_a_finished_batch_gives_freed_heap_back_once_after_its_last_file(
    tmp_path: Path, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)[:2]
    events: list[str] = []
    monkeypatch.setattr("retrieval_host.batch.trim_heap", lambda: events.append("trim"))
    ingest_paths(
        host.driver, CORPUS, files, context(), journal_path=tmp_path / "journal.jsonl",
        root=root, on_item=lambda item: events.append(item.status),
    )  # fmt: skip
    assert events == ["indexed", "indexed", "trim"]


def test_a_changed_file_is_ingested_again_despite_the_journal(tmp_path: Path, host: Host) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)[:2]
    journal = tmp_path / "journal.jsonl"
    ingest_paths(host.driver, CORPUS, files, context(), journal_path=journal, root=root)
    files[0].write_text(files[0].read_text() + "\nOne more rule.\n")
    report = ingest_paths(host.driver, CORPUS, files, context(), journal_path=journal, root=root)
    assert [i.status for i in report.items] == ["indexed", "skipped"]


def test_a_cancelled_batch_stops_between_files_with_only_whole_files_indexed(
    tmp_path: Path, host: Host
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)
    ids = source_ids(root, files)
    cancel = CancelToken()
    report = ingest_paths(
        host.driver, CORPUS, files, context(cancel=cancel), journal_path=tmp_path / "j.jsonl",
        root=root, progress=lambda done, total: cancel.cancel(), in_flight=2,
    )  # fmt: skip
    assert report.cancelled
    # No file starts after the cancel; the other file in flight stops before its commit,
    # unless already past it: the report names exactly what the store holds, and lists every
    # other file `cancelled` (stopped in flight, or never started).
    assert [i.source_id for i in report.items] == ids
    indexed = [i.source_id for i in report.items if i.status == "indexed"]
    assert len(indexed) in (1, 2)
    cancelled = [i for i in report.items if i.status == "cancelled"]
    assert len(indexed) + len(cancelled) == len(files)
    assert [i.reason for i in cancelled].count("in-flight") == 2 - len(indexed)
    assert [i.reason for i in cancelled].count("not-started") == len(files) - 2
    stored = sources(host, ids)
    assert sorted(stored) == sorted(indexed)
    total = sum(count for _, count, _ in stored.values())
    assert len(dump_index(host, ids)) == total  # complete, nothing partial


def test_a_bad_file_is_recorded_and_the_batch_goes_on(tmp_path: Path, host: Host) -> None:
    root = tmp_path / "docs"
    good = write_corpus(root)[:2]
    bad = root / "broken.pdf"
    bad.write_bytes(b"%PDF-1.7\nnot really a pdf")
    unknown = root / "notes.docx"
    unknown.write_bytes(b"PK\x03\x04 a Word file")
    journal = tmp_path / "journal.jsonl"
    report = ingest_paths(
        host.driver, CORPUS, [good[0], bad, unknown, good[1]], context(), journal_path=journal,
        root=root,
    )  # fmt: skip
    assert [(i.status, i.error_code, i.reason) for i in report.items] == [
        ("indexed", None, None),
        ("failed", "INVALID_DOCUMENT", "pdf-malformed"),
        ("failed", "UNSUPPORTED_MEDIA_TYPE", "unknown-suffix"),
        ("indexed", None, None),
    ]
    assert report.count("failed") == 2
    rerun = ingest_paths(
        host.driver, CORPUS, [good[0], bad], context(), journal_path=journal, root=root
    )
    assert [i.status for i in rerun.items] == ["skipped", "failed"]  # failures are retried


def test_two_files_with_one_source_id_are_refused_up_front(tmp_path: Path, host: Host) -> None:
    a = tmp_path / "a" / "guide.md"
    b = tmp_path / "b" / "guide.md"
    for path in (a, b):
        path.parent.mkdir()
        path.write_text("# Guide\n\nText.\n")
    with pytest.raises(RetrievalError) as caught:
        ingest_paths(host.driver, CORPUS, [a, b], context(), journal_path=tmp_path / "j.jsonl")
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert caught.value.reason == "duplicate-source-id"
    assert host.embedding.embed_calls == 0


def test_a_file_named_twice_is_ingested_once(tmp_path: Path, host: Host) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)[:1]
    report = ingest_paths(
        host.driver, CORPUS, [files[0], root / "guides" / ".." / "guides" / files[0].name],
        context(), journal_path=tmp_path / "j.jsonl", root=root,
    )  # fmt: skip
    assert [(i.source_id, i.status) for i in report.items] == [("guides/ferries.md", "indexed")]


def test_a_file_outside_the_root_is_refused_up_front(tmp_path: Path, host: Host) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)[:1]
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nText.\n")
    (root / "link.md").symlink_to(outside)
    with pytest.raises(RetrievalError) as caught:
        ingest_paths(
            host.driver, CORPUS, [files[0], outside], context(),
            journal_path=tmp_path / "j.jsonl", root=root,
        )  # fmt: skip
    assert caught.value.reason == "outside-root"
    assert host.embedding.embed_calls == 0
    # A link under the root keeps its own name there (the caller named it).
    report = ingest_paths(
        host.driver, CORPUS, [root / "link.md"], context(), journal_path=tmp_path / "j.jsonl",
        root=root,
    )  # fmt: skip
    assert [(i.source_id, i.status) for i in report.items] == [("link.md", "indexed")]


def test_a_missing_journal_folder_is_a_journal_error(tmp_path: Path, host: Host) -> None:
    files = write_corpus(tmp_path / "docs")[:1]
    with pytest.raises(JournalError, match="does not exist"):
        ingest_paths(
            host.driver, CORPUS, files, context(), journal_path=tmp_path / "none" / "j.jsonl"
        )
    assert host.embedding.embed_calls == 0


@pytest.mark.parametrize(
    "content",
    [
        b'{\n  "listen": {"port": 8443}\n}\n',
        b"garbage\n",
        b'{"v": 99}\n',
        b"# notes\n",
        # One line without a line end, as `json.dump` writes a host.json or an ACL file.
        b'{"listen": {"port": 8443}, "tokens": []}',
        b'{"subjects": {"quickstart": {"namespace": "demo"}}}',
        b'{"chunkCount": 1}',
        b'{"chunkCount":1,"corp\n# notes\n',  # a record's start, then no record
        b"\n",
        b"{\n",
    ],
)
def test_a_file_that_is_not_a_journal_is_refused_and_left_as_it_was(
    tmp_path: Path, host: Host, content: bytes
) -> None:
    # A black-box test: `--journal state/host.json` appended 30 records to the host's config.
    files = write_corpus(tmp_path / "docs")[:1]
    other = tmp_path / "host.json"
    other.write_bytes(content)
    with pytest.raises(JournalError, match="is not a journal"):
        ingest_paths(host.driver, CORPUS, files, context(), journal_path=other)
    assert other.read_bytes() == content
    assert host.embedding.embed_calls == 0
    # A journal torn during its first write is still one: the run goes on.
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"chunkCount":1,"corp')
    report = ingest_paths(host.driver, CORPUS, files, context(), journal_path=torn)
    assert [i.status for i in report.items] == ["indexed"]
    assert torn.read_bytes().startswith(b'{"chunkCount":1,"corp\n{"chunkCount":')
    # ...and stays one: the run that closed the torn line left it first (a black-box test:
    # every later run refused the journal).
    again = ingest_paths(host.driver, CORPUS, files, context(), journal_path=torn)
    assert [i.status for i in again.items] == ["skipped"]
    twice = tmp_path / "twice.jsonl"  # the first record torn, then the resume's first too
    twice.write_bytes(b'{"chunkCount":1,"corp\n{"corpus":"lib')
    assert [
        i.status
        for i in ingest_paths(host.driver, CORPUS, files, context(), journal_path=twice).items
    ] == ["unchanged"]
    closed = tmp_path / "closed.jsonl"
    closed.write_bytes(b'{"chunkCount":1,"corp\n')  # closed, then stopped before a record
    assert [
        i.status
        for i in ingest_paths(host.driver, CORPUS, files, context(), journal_path=closed).items
    ] == ["unchanged"]


def test_a_file_past_the_deadline_is_recorded_and_the_batch_goes_on(
    tmp_path: Path, host: Host
) -> None:
    # The deadline cancels that one file's work, never the batch's own context.
    root = tmp_path / "docs"
    files = write_corpus(root)[:2]
    report = ingest_paths(
        host.driver, CORPUS, files, context(), journal_path=tmp_path / "j.jsonl", root=root,
        deadline_s=0.001,
    )  # fmt: skip
    assert not report.cancelled
    assert [(i.status, i.error_code, i.reason) for i in report.items] == [
        ("failed", "DOCUMENT_TOO_COMPLEX", "deadline"),
    ] * 2
    assert sources(host, source_ids(root, files)) == {}


def test_a_too_complex_file_is_recorded_and_the_batch_goes_on(tmp_path: Path, host: Host) -> None:
    root = tmp_path / "docs"
    good = write_corpus(root)[:1]
    bomb = root / "bomb.pdf"
    bomb.write_bytes(docs.operator_bomb_pdf(500_000))
    report = ingest_paths(
        host.driver, CORPUS, [bomb, good[0]], context(), journal_path=tmp_path / "j.jsonl",
        root=root,
    )  # fmt: skip
    assert [(i.status, i.error_code, i.reason) for i in report.items] == [
        ("failed", "DOCUMENT_TOO_COMPLEX", "pdf-operators"),
        ("indexed", None, None),
    ]


def test_the_cli_batch_takes_its_deadline_from_the_host_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(REPO / "config" / "host.example.json", tmp_path / "host.example.json")
    acl = {"subjects": {"ops": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    root = tmp_path / "docs"
    write_corpus(root)  # three Markdown files under guides/
    environ = {
        "RETRIEVAL_HOST_STORE__SQLITE_PATH": str(tmp_path / "store" / "retrieval.sqlite"),
        "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "acl.json"}),
        "RETRIEVAL_HOST_LIMITS__INGEST_DEADLINE_S": "0.001",
    }
    argv = [
        "ingest", str(root / "guides"), "--config", str(tmp_path / "host.example.json"),
        "--corpus", "library", "--subject", "ops", "--journal", str(tmp_path / "j.jsonl"),
    ]  # fmt: skip
    assert main(argv, environ=environ) == 1
    out = capsys.readouterr().out
    assert out.count("DOCUMENT_TOO_COMPLEX deadline") == 3
    assert "0 indexed, 0 unchanged, 0 skipped, 3 failed" in out


class _Counting:
    """The driver as `ingest_paths` sees it, counting the files it ingests at once; the first
    `gate` files wait for each other, so more than one in flight is proven, not hoped for."""

    def __init__(self, driver: Driver, gate: int) -> None:
        self.driver = driver
        self.ingest_limits = driver.ingest_limits
        self.barrier = threading.Barrier(gate, timeout=60)
        self.lock = threading.Lock()
        self.running = self.most = self.started = 0

    def ingest_context(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.running += 1
            self.started += 1
            first = self.started <= self.barrier.parties
            self.most = max(self.most, self.running)
        try:
            if first:
                self.barrier.wait()
            return self.driver.ingest_context(*args, **kwargs)
        finally:
            with self.lock:
                self.running -= 1


@pytest.mark.parametrize("in_flight", [1, 3])
def test_files_in_flight_are_bounded_and_reported_in_file_order(
    tmp_path: Path, host: Host, in_flight: int
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)
    counting = _Counting(host.driver, gate=in_flight)
    finished: list[str] = []
    report = ingest_paths(
        cast(Driver, counting), CORPUS, files, context(), journal_path=tmp_path / "j.jsonl",
        root=root, in_flight=in_flight, on_item=lambda item: finished.append(item.source_id),
    )  # fmt: skip
    assert counting.most == in_flight
    assert [i.source_id for i in report.items] == source_ids(root, files)
    assert sorted(finished) == sorted(source_ids(root, files))
    assert {i.status for i in report.items} == {"indexed"}
    assert sorted(sources(host, source_ids(root, files))) == sorted(source_ids(root, files))


class _StoreDown(_Counting):
    def ingest_context(self, *args: Any, **kwargs: Any) -> Any:
        request = args[0]
        if request.source_id.endswith("ferries.md"):
            raise RetrievalError(ErrorCode.STORE_UNAVAILABLE, "the store went away.")
        return self.driver.ingest_context(*args, **kwargs)


def test_a_failure_not_about_one_file_stops_the_files_in_flight_and_is_raised(
    tmp_path: Path, host: Host
) -> None:
    root = tmp_path / "docs"
    files = write_corpus(root)
    journal = tmp_path / "j.jsonl"
    with pytest.raises(RetrievalError) as info:
        ingest_paths(
            cast(Driver, _StoreDown(host.driver, gate=1)), CORPUS, files, context(),
            journal_path=journal, root=root, in_flight=2,
        )  # fmt: skip
    assert info.value.code is ErrorCode.STORE_UNAVAILABLE
    # No file started after the failure: at most the one beside it in flight committed.
    stored = sources(host, source_ids(root, files))
    assert len(stored) <= 2
    lines = journal.read_text().splitlines() if journal.exists() else []
    assert {json.loads(line)["sourceId"] for line in lines} == set(stored)


class _HoldAllButFirst(_Counting):
    """Every file after the first waits in its ingest, checking its cancel token as the real
    work does, until the batch cancels it (or 30 s pass: then it says so)."""

    cancelled = 0

    def ingest_context(self, *args: Any, **kwargs: Any) -> Any:
        request, ctx = args[0], args[1]
        with self.lock:
            self.started += 1
            first = self.started == 1
        if first:
            return self.driver.ingest_context(*args, **kwargs)
        self.barrier.wait()  # all held files are in flight before the first one finishes
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ctx.cancel.wait(0.01)  # raises CANCELLED once the batch is cancelled
            except RetrievalError:
                with self.lock:
                    self.cancelled += 1
                raise
        raise AssertionError(f"{request.source_id} was never cancelled")


def test_a_keyboard_interrupt_stops_the_files_in_flight_before_it_is_raised(
    tmp_path: Path, host: Host
) -> None:
    # Without a signal handler of its own, Ctrl-C raises KeyboardInterrupt in the thread that
    # waits for the files: leaving the pool must not wait for them to finish and commit.
    root = tmp_path / "docs"
    files = write_corpus(root)
    journal = tmp_path / "j.jsonl"
    holding = _HoldAllButFirst(host.driver, gate=3)  # two held files and the interrupt

    def interrupt(item: object) -> None:
        holding.barrier.wait()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ingest_paths(
            cast(Driver, holding), CORPUS, files, context(), journal_path=journal, root=root,
            in_flight=3, on_item=interrupt,
        )  # fmt: skip
    assert holding.cancelled == 2
    # Only the file that was let through: no other started, the held ones did not commit.
    done = completed_ids(journal)
    assert len(done) == 1
    assert set(sources(host, source_ids(root, files))) == done


def test_a_journal_that_cannot_be_written_stops_the_batch_with_a_journal_error(
    tmp_path: Path, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box test: a journal on a full disk ended the command with a raw traceback.
    root = tmp_path / "docs"
    files = write_corpus(root)[:2]
    journal = tmp_path / "full" / "j.jsonl"
    journal.parent.mkdir()
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(journal):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(JournalError) as info:
        ingest_paths(
            host.driver, CORPUS, files, context(), journal_path=journal, root=root, in_flight=1
        )
    monkeypatch.undo()
    assert "could not be written: No space left on device" in str(info.value)
    # The file whose line failed had committed; a rerun with a working journal finds it.
    report = ingest_paths(
        host.driver, CORPUS, files, context(), journal_path=tmp_path / "j.jsonl", root=root
    )
    assert [i.status for i in report.items] == ["unchanged", "indexed"]

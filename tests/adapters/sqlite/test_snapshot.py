"""Index snapshots: a store maps the snapshot written by an earlier one, trusts only what SQLite
still holds as written, and falls back to SQLite for anything it cannot use."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore, snapshot, snapshotting
from retrieval_host.adapters.sqlite.snapshot import snapshot_path
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.models import Location
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, unit_vectors

LIMITS = CapacityLimits()
WORDS = "cell virus protein gene tumour immune signal enzyme membrane receptor kinase".split()
SNAPSHOT_LOG = "retrieval_host.adapters.sqlite"


def texts(rng: np.random.Generator, count: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(count)]


def put(store: SqliteVectorStore, rng: np.random.Generator, sid: str, rev: str, count: int) -> None:
    """One revision of `sid`, with varied locations (None fields, document ids)."""
    previous = store.get_source("c1", "ns", sid)
    source, chunks = revision(
        sid, rev, unit_vectors(rng, count), texts=texts(rng, count), metadata={"rev": rev}
    )
    chunks = [
        dataclasses.replace(
            c,
            location=Location(
                page=None if i % 3 == 0 else i + 1,
                start_line=i * 2 + 1,
                end_line=None if i % 2 else i * 2 + 2,
                document_id=None if i % 4 == 0 else f"doc-{sid}-{i}",
            ),
        )
        for i, c in enumerate(chunks)
    ]
    store.replace_source(
        "c1",
        "ns",
        source,
        chunks,
        expected_revision=None if previous is None else previous.revision,
        limits=LIMITS,
    )


def fill(path: Path, seed: int = 1, sources: int = 12, snapshots: bool = True) -> None:
    rng = np.random.default_rng(seed)
    with SqliteVectorStore.open(path, snapshots=snapshots) as store:
        store.open_corpus(descriptor("c1"))
        for i in range(sources):
            put(store, rng, f"s{i}", "r1", 1 + i % 5)


def answers(store: SqliteVectorStore) -> dict[str, Any]:
    """Everything a search can tell about the index, over every current source."""
    allowed = store.current_revisions("c1", "ns")
    rng = np.random.default_rng(99)
    query = unit_vectors(rng, 1)[0]
    terms = query_terms("virus protein kinase cell", DEFAULT_ANALYZER)
    dense = store.search("c1", "ns", allowed, query, 1000, CancelToken())
    lexical = store.lexical_search("c1", "ns", allowed, terms, 1000, CancelToken())
    half = dict(sorted(allowed.items())[::2])
    return {
        "allowed": allowed,
        "dense": [(h.chunk_id, h.revision, h.text, h.location, round(h.score, 6)) for h in dense],
        "lexical": [(h.chunk_id, h.text, round(h.score, 9), h.metadata) for h in lexical],
        "half": [h.chunk_id for h in store.search("c1", "ns", half, query, 5, CancelToken())],
        "dense_scores": [
            None if s is None else round(s, 6)
            for s in store.dense_scores("c1", "ns", dense, query, CancelToken())
        ],
        "lexical_scores": store.lexical_scores("c1", "ns", allowed, lexical, terms, CancelToken()),
    }


def fresh_answers(path: Path) -> dict[str, Any]:
    """What a store that reads SQLite alone answers."""
    with SqliteVectorStore.open(path, snapshots=False) as store:
        store.open_corpus(descriptor("c1"))
        return answers(store)


def open_warned(path: Path, caplog: pytest.LogCaptureFixture, **options: Any) -> SqliteVectorStore:
    """Open the store and its corpus with the snapshot's warnings captured (cleared first)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SNAPSHOT_LOG):
        store = SqliteVectorStore.open(path, **options)
        store.open_corpus(descriptor("c1"))
    return store


def open_mapped(path: Path, caplog: pytest.LogCaptureFixture, **options: Any) -> SqliteVectorStore:
    """Open the store and its corpus, asserting that the snapshot was mapped."""
    caplog.clear()
    store = SqliteVectorStore.open(path, **options)
    with caplog.at_level(logging.INFO, logger=SNAPSHOT_LOG):
        store.open_corpus(descriptor("c1"))
    assert "mapped the index snapshot" in caplog.text
    return store


def assert_same(left: dict[str, Any], right: dict[str, Any]) -> None:
    for key in left:
        assert left[key] == right[key], key


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    return tmp_path / "store.db"


def test_a_reopened_store_maps_its_snapshot_and_answers_the_same(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path)
    snap = snapshot_path(path, "c1")
    assert snap.exists()  # written at close
    assert snap.stat().st_mode & 0o777 == 0o600
    expected = fresh_answers(path)
    assert expected["dense"] and expected["lexical"]
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_changes_committed_after_the_snapshot_are_loaded_at_open(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path)
    before = digest(snapshot_path(path, "c1"))
    # Another writer that keeps no snapshot: replaces and adds sources (its deletes remove
    # the snapshot: `test_a_delete_without_snapshots_removes_the_file_that_holds_its_rows`).
    rng = np.random.default_rng(7)
    with SqliteVectorStore.open(path, snapshots=False) as other:
        other.open_corpus(descriptor("c1"))
        put(other, rng, "s1", "r2", 4)
        put(other, rng, "new", "r1", 3)
    assert digest(snapshot_path(path, "c1")) == before
    expected = fresh_answers(path)
    with open_mapped(path, caplog) as store:
        got = answers(store)
        store.delete_source("c1", "ns", "s2", "r1")
    assert_same(got, expected)
    assert got["allowed"]["s1"] == "r2" and "new" in got["allowed"]


def test_a_snapshot_from_a_diverged_history_is_not_trusted_for_what_differs(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A backup is restored after the snapshot was written, and the restored store is written
    # again: the same source at the same commit generation holds another revision.
    fill(path, sources=3)
    backup = path.with_name("backup.db")
    shutil.copyfile(path, backup)
    rng = np.random.default_rng(3)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        put(store, rng, "s1", "from-the-lost-history", 2)  # the snapshot written at close
    shutil.copyfile(backup, path)
    with SqliteVectorStore.open(path, snapshots=False) as restored:
        restored.open_corpus(descriptor("c1"))
        put(restored, rng, "s1", "after-the-restore", 2)  # same generation, other revision
    expected = fresh_answers(path)
    with open_mapped(path, caplog) as store:
        got = answers(store)
    assert_same(got, expected)
    assert got["allowed"]["s1"] == "after-the-restore"
    assert all(rev != "from-the-lost-history" for _, rev, *_ in got["dense"])


def _truncate(snap: Path) -> None:
    with snap.open("r+b") as f:
        f.truncate(snap.stat().st_size // 3)


def _garbage(snap: Path) -> None:
    snap.write_bytes(os.urandom(5000))


def _other_header(snap: Path) -> None:
    data = bytearray(snap.read_bytes())
    at = data.index(b'"corpus":"c1"')
    data[at : at + 13] = b'"corpus":"c2"'
    snap.write_bytes(bytes(data))


def _shared(snap: Path) -> None:
    snap.chmod(0o666)


def _link(snap: Path) -> None:
    target = snap.with_name("elsewhere")
    snap.rename(target)
    snap.symlink_to(target)


@pytest.mark.parametrize(
    "spoil",
    [_truncate, _garbage, _other_header, _shared, _link],
    ids=["truncated", "garbage", "other-corpus", "writable-by-others", "symlink"],
)
def test_an_unusable_snapshot_is_ignored_and_replaced(
    path: Path, caplog: pytest.LogCaptureFixture, spoil: Any
) -> None:
    fill(path)
    expected = fresh_answers(path)
    snap = snapshot_path(path, "c1")
    spoil(snap)
    with open_warned(path, caplog) as store:
        assert "index snapshot" in caplog.text and "not used" in caplog.text
        assert "mapped the index snapshot" not in caplog.text
        assert_same(answers(store), expected)
    # The close wrote a good one in its place (a new file: never through a link).
    assert not snap.is_symlink() and snap.stat().st_mode & 0o777 == 0o600
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_rows_written_after_the_open_never_reach_the_mapped_file(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path)
    snap = snapshot_path(path, "c1")
    before = digest(snap)
    rng = np.random.default_rng(11)
    with open_mapped(path, caplog) as store:
        for step in range(40):  # appends in place, then a compaction into private arrays
            put(store, rng, f"s{step % 12}", f"r{step + 2}", 1 + step % 6)
            if step == 5:
                assert digest(snap) == before
        assert digest(snap) == before
        got = answers(store)
    assert_same(got, fresh_answers(path))
    assert digest(snap) != before  # the close wrote the new state
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), got)


def test_a_read_only_store_maps_a_snapshot_but_never_writes_one(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path, snapshots=False)
    snap = snapshot_path(path, "c1")
    assert not snap.exists()
    with SqliteVectorStore.open(path, read_only=True) as store:
        store.open_corpus(descriptor("c1"))
        store.checkpoint()
    assert not snap.exists()
    fill(path, sources=4)  # a writer's close writes it
    with open_mapped(path, caplog, read_only=True) as store:
        assert_same(answers(store), fresh_answers(path))


def test_a_store_without_a_snapshot_writes_one_in_the_background(
    path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store written by the release before snapshots (the same database, no snapshot file)
    # loads from SQLite, then writes its snapshot without waiting for a close.
    fill(path, snapshots=False)
    snap = snapshot_path(path, "c1")
    monkeypatch.setattr(snapshotting, "SNAPSHOT_MIN_CHANGES", 10)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        deadline = time.monotonic() + 60
        while not snap.exists():
            assert time.monotonic() < deadline, "no snapshot was written"
            time.sleep(0.01)
        expected = answers(store)
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_a_second_process_does_not_write_the_state_another_has_written(path: Path) -> None:
    # Two workers of one host: both saw the same commits; the first to close writes the
    # snapshot, the second finds it as recent as its own state and leaves it.
    fill(path, sources=3)
    snap = snapshot_path(path, "c1")
    first = SqliteVectorStore.open(path)
    second = SqliteVectorStore.open(path)
    for store in (first, second):
        store.open_corpus(descriptor("c1"))
    put(first, np.random.default_rng(5), "late", "r1", 2)
    assert "late" in second.current_revisions("c1", "ns")  # the second loaded the commit
    first.close()
    written = snap.stat().st_ino
    second.close()
    assert snap.stat().st_ino == written
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        assert_same(answers(store), fresh_answers(path))


def test_what_an_interrupted_write_left_is_ignored_and_removed(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path, sources=3)
    snap = snapshot_path(path, "c1")
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead = snap.with_name(f"{snap.name}.{exited.pid}.1.tmp")  # its writer has exited
    dead.write_bytes(b"half a snapshot")
    ours = snap.with_name(f"{snap.name}.{os.getpid()}.7.tmp")  # a live writer's
    ours.write_bytes(b"being written")
    with open_mapped(path, caplog) as store:
        put(store, np.random.default_rng(1), "s0", "r2", 2)
    assert not dead.exists()
    assert ours.exists()


def test_a_namespace_emptied_before_the_snapshot_opens_empty_and_takes_new_rows(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fill(path, sources=3)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        for sid in ("s0", "s1", "s2"):
            store.delete_source("c1", "ns", sid, "r1")
    with open_mapped(path, caplog) as store:
        assert store.current_revisions("c1", "ns") == {}
        put(store, np.random.default_rng(2), "again", "r1", 3)
        got = answers(store)
    assert_same(got, fresh_answers(path))
    assert [h[0] for h in got["dense"]] and got["allowed"] == {"again": "r1"}


SECRET = "the ocelot escrow phrase is plumtree-vermilion-42"


def put_text(store: SqliteVectorStore, sid: str, rev: str, text: str) -> None:
    previous = store.get_source("c1", "ns", sid)
    source, chunks = revision(sid, rev, unit_vectors(np.random.default_rng(3), 1), texts=[text])
    expected = None if previous is None else previous.revision
    store.replace_source("c1", "ns", source, chunks, expected_revision=expected, limits=LIMITS)


def holds(snap: Path, text: str) -> bool:
    return text.encode() in snap.read_bytes()


def snapshot_holding(path: Path, source_id: str, text: str) -> Path:
    """A store of three sources and `source_id` holding `text`, closed: its snapshot file."""
    fill(path, sources=3)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        put_text(store, source_id, "r1", text)
    snap = snapshot_path(path, "c1")
    assert holds(snap, text)
    return snap


def wait_until_gone(snap: Path, text: str, what: str) -> None:
    """Poll until the snapshot file no longer holds `text` (rewritten in the background)."""
    deadline = time.monotonic() + 60
    while holds(snap, text):
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_delete_rewrites_the_snapshot_without_the_deleted_text(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box test: a deleted passage stayed in plaintext in the snapshot file through
    # restarts, while the delete answered `overwritten`.
    snap = snapshot_holding(path, "erase-me", SECRET)
    with open_mapped(path, caplog) as store:
        assert store.reclamation == "pending"
        store.delete_source("c1", "ns", "erase-me", "r1")
        # Rewritten in the background, not at close.
        wait_until_gone(snap, SECRET, "the snapshot still holds the deleted text")
        live = answers(store)
    assert not holds(snap, SECRET)
    expected = fresh_answers(path)
    assert_same(live, expected)
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_a_snapshot_leaves_out_replaced_revisions(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snap = snapshot_holding(path, "doc", SECRET)
    with open_mapped(path, caplog) as store:
        put_text(store, "doc", "r2", "the ocelot escrow phrase was changed")
        put(store, np.random.default_rng(4), "s1", "r2", 3)
    snap = snapshot_path(path, "c1")
    assert not holds(snap, SECRET)
    assert holds(snap, "the ocelot escrow phrase was changed")
    with open_mapped(path, caplog) as store:
        got = answers(store)
    assert_same(got, fresh_answers(path))
    assert got["allowed"]["doc"] == "r2" and got["allowed"]["s1"] == "r2"


def test_a_worker_with_an_older_state_never_writes_over_a_delete_s_rewrite(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A review: two workers write one snapshot file; one whose state predated a delete
    # checked the file, then renamed its image over the one the delete had just cleaned.
    snap = snapshot_holding(path, "erase-me", SECRET)
    first, second = SqliteVectorStore.open(path), SqliteVectorStore.open(path)
    for store in (first, second):
        store.open_corpus(descriptor("c1"))
    put(second, np.random.default_rng(5), "from-second", "r1", 2)  # it writes at close
    entered, release = threading.Event(), threading.Event()
    real_write = snapshot.write

    def held_write(*args: Any, **kwargs: Any) -> int:
        if threading.current_thread().name == "second-close":
            entered.set()  # past its check, before its rename
            assert release.wait(60)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(snapshot, "write", held_write)
    closing = threading.Thread(target=second.close, name="second-close")
    closing.start()
    try:
        assert entered.wait(60)
        first.delete_source("c1", "ns", "erase-me", "r1")  # its rewrite waits for the file
    finally:
        release.set()
        closing.join(60)
    wait_until_gone(snap, SECRET, "the deleted text is back in the snapshot")
    first.close()
    assert not holds(snap, SECRET)
    assert "erase-me" not in fresh_answers(path)["allowed"]


def test_a_delete_without_snapshots_removes_the_file_that_holds_its_rows(path: Path) -> None:
    # A black-box test: with `indexSnapshots: false` a delete answered `overwritten` while the
    # snapshot an earlier start wrote kept the deleted text for good.
    snap = snapshot_holding(path, "erase-me", SECRET)
    with SqliteVectorStore.open(path, snapshots=False) as store:
        store.open_corpus(descriptor("c1"))
        assert store.reclamation == "overwritten"
        store.delete_source("c1", "ns", "erase-me", "r1")
        assert not snap.exists()
    assert not any(SECRET.encode() in p.read_bytes() for p in path.parent.iterdir() if p.is_file())


def snapshot_of_a_replaced_source(path: Path) -> Path:
    """A snapshot holding `SECRET` in source `doc`, which a writer without snapshots then
    replaced: the file holds dead rows."""
    snap = snapshot_holding(path, "doc", SECRET)
    with SqliteVectorStore.open(path, snapshots=False) as other:
        other.open_corpus(descriptor("c1"))
        put_text(other, "doc", "r2", "the ocelot escrow phrase was changed")
    return snap


def test_a_snapshot_that_holds_dead_rows_is_rewritten_after_an_open(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box test: the snapshot an earlier release wrote (dead rows kept) still held a
    # deleted passage after the upgrade and a clean stop. Here the dead rows come from a
    # writer without snapshots that replaced the source after the file was written.
    snap = snapshot_of_a_replaced_source(path)
    assert holds(snap, SECRET)
    with open_mapped(path, caplog) as store:
        # Rewritten in the background after the open.
        wait_until_gone(snap, SECRET, "the replaced text is still in the snapshot")
        got = answers(store)
    assert_same(got, fresh_answers(path))
    assert got["allowed"]["doc"] == "r2"


def test_a_snapshot_of_another_format_is_rewritten_after_an_open(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Probe U, session 42: a snapshot an earlier release wrote (format 1 and 2 alike) was not
    # used, and kept a source's deleted text on disk until a clean stop (never, after a
    # crash): a rewrite was due only once enough rows changed.
    snap = snapshot_of_a_replaced_source(path)
    data = bytearray(snap.read_bytes())
    data[: len(snapshot.MAGIC)] = snapshot.MAGIC[:-1] + b"\x01"  # an earlier release's
    snap.write_bytes(bytes(data))
    with open_warned(path, caplog) as store:
        assert "not used" in caplog.text
        wait_until_gone(snap, SECRET, "the unused snapshot still holds the replaced text")
        got = answers(store)
    assert_same(got, fresh_answers(path))
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), got)

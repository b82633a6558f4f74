"""The index snapshot after the database was put back to an earlier state (a backup restored as
deploy/README says, a new database in the same place): nothing of the snapshot the database no
longer holds is served, and its text leaves the disk (probe T, session 40). A source's rows are
taken from a snapshot only when SQLite holds that very write (its content fingerprint), and a
snapshot of a generation past the database's is removed at open, its graph files with it."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore, snapshot
from retrieval_host.adapters.sqlite.snapshot import current_identity, snapshot_path
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.fingerprint import joined_text, revision_fingerprint, sha256_text
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.models import ChunkInput, Location, SourceInfo
from retrieval_host.core.ports import CapacityLimits, StoredChunk, StoredSource
from tests.adapters.sqlite.test_snapshot import SNAPSHOT_LOG, wait_until_gone
from tests.adapters.sqlite.test_snapshot_checks import layout, place, with_header
from tests.support.sqlite_store import DIM, descriptor, unit_vectors

LIMITS = CapacityLimits()
BACKUP_SCRIPT = Path(__file__).parents[3] / "deploy" / "scripts" / "sqlite_backup.py"
CALLER_DIGEST = "d" * 64  # a `documentSha256` the caller gave, the same for both writes
OLD_TEXT = "ALPHA secret old text"
# Marker words of passages the restored database does not hold (or that were deleted).
MARKERS = ("ALPHA", "PURPLEELEPHANT", "KEEPSECRET")


def write(
    store: SqliteVectorStore,
    sid: str,
    texts: Sequence[str],
    *,
    sha: str | None = None,
    locations: Sequence[Location] | None = None,
    rev: str = "r1",
) -> None:
    """Index `sid` at `rev` as the service does: the document digest the caller gave (or that
    of the text) and the write's content fingerprint (`core.fingerprint`)."""
    places = locations if locations is not None else [Location(page=1)] * len(texts)
    inputs = [
        ChunkInput(f"{sid}-{i}", text, place)
        for i, (text, place) in enumerate(zip(texts, places, strict=True))
    ]
    info = SourceInfo(sid, rev, title=f"Title of {sid}")
    digest = sha or sha256_text(joined_text(inputs))
    source = StoredSource(
        source_id=sid,
        revision=rev,
        title=info.title,
        metadata={},
        document_sha256=digest,
        fingerprint=revision_fingerprint(info, inputs, digest),
        chunk_count=len(inputs),
    )
    vectors = unit_vectors(np.random.default_rng(len(sid)), len(inputs))
    chunks = [StoredChunk(c.id, i, c.text, c.location, vectors[i]) for i, c in enumerate(inputs)]
    previous = store.get_source("c1", "ns", sid)
    expected = None if previous is None else previous.revision
    store.replace_source("c1", "ns", source, chunks, expected_revision=expected, limits=LIMITS)


def open_store(path: Path, **options: Any) -> SqliteVectorStore:
    store = SqliteVectorStore.open(path, **options)
    store.open_corpus(descriptor("c1"))
    return store


def served(store: SqliteVectorStore) -> list[tuple[str, str, Location]]:
    """What a lexical search over every current source returns: (chunk id, text, location)."""
    allowed = store.current_revisions("c1", "ns")
    terms = query_terms(f"{OLD_TEXT} BETA new text shared passage", DEFAULT_ANALYZER)
    hits = store.lexical_search("c1", "ns", allowed, terms, 100, CancelToken())
    return sorted((h.chunk_id, h.text, h.location) for h in hits)


def from_sqlite(path: Path) -> list[tuple[str, str, Location]]:
    """What a store that reads SQLite alone serves."""
    with open_store(path, snapshots=False) as store:
        return served(store)


def index_files(path: Path) -> list[Path]:
    """The files beside the database that hold index data: snapshots, graph files, their
    checks (not the writers' empty lock files)."""
    return sorted(
        p
        for p in path.parent.glob(f"{path.name}-index-*")
        if p.is_file() and not p.name.endswith(".lock")
    )


def markers_on_disk(path: Path) -> dict[str, list[str]]:
    """Which of the index files hold each marker word's bytes."""
    found = {
        word: [p.name for p in index_files(path) if word.encode() in p.read_bytes()]
        for word in MARKERS
    }
    return {word: names for word, names in found.items() if names}


def graph_files(path: Path) -> list[Path]:
    return [p for p in index_files(path) if "-graph-" in p.name]


def restore(backup: Path, path: Path) -> None:
    """deploy/README "Restore": the backup as the database file (0600), no -wal or -shm."""
    shutil.copyfile(backup, path)
    path.chmod(0o600)
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    return store / "retrieval.sqlite"


def restored(path: Path, backup: Path) -> None:
    """The probe's history: keep@r1, an online backup, then S@r1 (OLD_TEXT, the caller's
    digest), gone@r1 and two more, stopped (the snapshot at generation 5 written), a graph of
    the snapshot's rows written beside it by the next start; then the backup restored."""
    with open_store(path) as store:
        write(store, "keep", ["keep one KEEPSECRET text"])  # generation 1
        subprocess.run([sys.executable, str(BACKUP_SCRIPT), str(path), str(backup)], check=True)
        write(store, "S", [OLD_TEXT], sha=CALLER_DIGEST)  # 2
        write(store, "gone", ["gone text PURPLEELEPHANT"])  # 3
        write(store, "x1", ["filler one"])  # 4
        write(store, "x2", ["filler two"])  # 5
    with open_store(path, approximate_min_rows=1) as store:
        allowed = store.current_revisions("c1", "ns")
        store.search(
            "c1", "ns", allowed, unit_vectors(np.random.default_rng(1), 1)[0], 3, CancelToken()
        )
        store.wait_for_graphs()
    assert graph_files(path)
    assert set(markers_on_disk(path)) == set(MARKERS)
    restore(backup, path)


def test_after_a_backup_restore_no_text_the_database_lost_or_deleted_is_served_or_kept(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Probe T, session 40: after this history the lexical search returned S-0 with the old
    # text (the snapshot's S matched revision, digest, generation and count), and the old,
    # rolled-back and deleted text stayed in the snapshot for good (every rewrite skipped:
    # the file's generation was past the restored database's).
    restored(path, tmp_path / "backup.sqlite")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SNAPSHOT_LOG):
        store = open_store(path)
    try:
        # Removed at the open, its graph files too, and said so once.
        assert markers_on_disk(path) == {} and graph_files(path) == []
        assert store.current_revisions("c1", "ns") == {"keep": "r1"}
        assert "past the database's 1" in caplog.text and "generation 5" in caplog.text
        assert caplog.text.count(str(snapshot_path(path, "c1"))) == 1
        write(store, "S", ["BETA new text"], sha=CALLER_DIGEST)  # generation 2 again
        store.delete_source("c1", "ns", "keep", "r1")  # 3
        assert [text for _, text, _ in served(store)] == ["BETA new text"]
    finally:
        store.close()
    assert snapshot_path(path, "c1").exists()  # the close wrote the database's state
    assert markers_on_disk(path) == {}
    with open_store(path) as again:
        assert [(cid, text) for cid, text, _ in served(again)] == [("S-0", "BETA new text")]
        assert served(again) == from_sqlite(path)
    assert markers_on_disk(path) == {}


def test_a_delete_after_a_restore_leaves_the_snapshot_within_the_rewrite(
    path: Path, tmp_path: Path
) -> None:
    # Probe T, session 40: after the restore, a delete's rewrite never ran (the file on disk
    # was of a later generation), so the deleted passage stayed in the snapshot.
    restored(path, tmp_path / "backup.sqlite")
    with open_store(path) as store:
        write(store, "late", ["a late passage"])
        store.checkpoint()  # the database's state is on disk: the file holds KEEPSECRET
        assert "KEEPSECRET" in markers_on_disk(path)
        store.delete_source("c1", "ns", "keep", "r1")
        wait_until_gone(snapshot_path(path, "c1"), "KEEPSECRET", "the delete's rewrite")
        assert markers_on_disk(path) == {}


def test_a_new_database_in_the_same_place_removes_the_old_one_s_snapshot(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    restored(path, tmp_path / "backup.sqlite")
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SNAPSHOT_LOG):
        store = open_store(path)
    try:
        assert index_files(path) == [] and markers_on_disk(path) == {}
        assert store.current_revisions("c1", "ns") == {}
        assert "past the database's 0" in caplog.text
        write(store, "n1", ["a fresh store passage"])
        write(store, "n2", ["filler two of the new store"])
        store.delete_source("c1", "ns", "n1", "r1")
        # Nothing of the old store's passages (the query's words are theirs and S's).
        assert [cid for cid, _, _ in served(store)] == ["n2-0"]
    finally:
        store.close()
    with open_store(path) as again:
        assert again.current_revisions("c1", "ns") == {"n2": "r1"}
        assert [cid for cid, _, _ in served(again)] == ["n2-0"]
        assert served(again) == from_sqlite(path)
    assert markers_on_disk(path) == {}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # The probe's case: the caller's document digest, other text.
        (
            {"texts": [OLD_TEXT], "sha": CALLER_DIGEST},
            {"texts": ["BETA new text"], "sha": CALLER_DIGEST},
        ),
        # The digest of the text alone: the same text at other locations.
        (
            {
                "texts": ["shared passage one", "shared passage two"],
                "locations": [Location(page=1), Location(page=2)],
            },
            {
                "texts": ["shared passage one", "shared passage two"],
                "locations": [Location(page=7, start_line=3), Location(page=9, start_line=4)],
            },
        ),
    ],
    ids=["caller-digest-other-text", "same-text-other-locations"],
)
def test_a_write_that_reuses_a_generation_is_read_from_sqlite_not_the_snapshot(
    path: Path, tmp_path: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    # The snapshot is not past the database here (a writer without snapshots brought it to
    # the same generation): only the fingerprint tells the two writes of S apart.
    backup = tmp_path / "backup.sqlite"
    with open_store(path) as store:
        write(store, "keep", ["keep one"])  # generation 1
    shutil.copyfile(path, backup)
    with open_store(path) as store:
        write(store, "S", **first)  # 2: in the snapshot written at close
    restore(backup, path)
    with open_store(path, snapshots=False) as other:
        write(other, "S", **second)  # generation 2 again, in the restored history
    expected = from_sqlite(path)
    assert expected != [] and all(text in second["texts"] for _, text, _ in expected)
    mapped = snapshot.read(
        snapshot_path(path, "c1"), "c1", descriptor("c1").canonical_json(), DIM, frozenset()
    )
    assert mapped is not None and mapped.generation == 2  # a snapshot an open may use
    del mapped
    with open_store(path) as store:
        got = served(store)
        source = store.get_source("c1", "ns", "S")
    assert got == expected
    assert source is not None and source.chunk_count == len(second["texts"])


def as_format_2(data: bytes) -> bytes:
    """The snapshot as the release before fingerprints wrote it: format 2, each source's
    entry (source id, revision, digest, generation, start, stop)."""

    def earlier(header: dict[str, Any]) -> None:
        header["format"] = 2
        for entry in header["namespaces"].values():
            entry["sources"] = [[*e[:3], *e[4:]] for e in entry["sources"]]

    return with_header(data, earlier)


def test_an_earlier_release_s_snapshot_is_rebuilt_from_sqlite(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with open_store(path) as store:
        for sid in ("a", "b", "c"):
            write(store, sid, [f"passage of {sid} shared passage"])
    snap = snapshot_path(path, "c1")
    place(snap, as_format_2(snap.read_bytes()))
    expected = from_sqlite(path)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=SNAPSHOT_LOG):
        store = open_store(path)
    try:
        assert "format 2, not 3" in caplog.text
        assert "mapped the index snapshot" not in caplog.text
        assert served(store) == expected
    finally:
        store.close()
    _, _, header = layout(snap.read_bytes())  # the close wrote this format
    assert header["format"] == snapshot.FORMAT
    with open_store(path, snapshots=False) as plain:
        fingerprints = {sid: plain.get_source("c1", "ns", sid) for sid in ("a", "b", "c")}
    assert {e[0]: e[3] for e in header["namespaces"]["ns"]["sources"]} == {
        sid: source.fingerprint for sid, source in fingerprints.items() if source is not None
    }
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=SNAPSHOT_LOG), open_store(path) as again:
        assert "mapped the index snapshot" in caplog.text
        assert served(again) == expected


def test_a_read_only_store_never_uses_a_snapshot_past_its_database(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    restored(path, tmp_path / "backup.sqlite")
    with open_store(path, snapshots=False) as other:  # leaves the snapshot as it is
        write(other, "S", ["BETA new text"], sha=CALLER_DIGEST)  # generation 2 again
    snap = snapshot_path(path, "c1")
    before = snap.read_bytes()
    expected = from_sqlite(path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SNAPSHOT_LOG):
        store = open_store(path, read_only=True)
    try:
        assert served(store) == expected
        assert [text for _, text, _ in expected if "BETA" in text or "ALPHA" in text] == [
            "BETA new text"
        ]
        assert "a read-only store leaves it in place" in caplog.text
    finally:
        store.close()
    assert snap.read_bytes() == before  # nothing written


def test_workers_opening_together_after_a_restore_neither_use_nor_fight_over_the_snapshot(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two workers of one host start on the restored database. The second read the old file
    # before the first removed it and wrote the database's state: the second must not
    # remove (nor use) that new file, and neither serves the old text.
    restored(path, tmp_path / "backup.sqlite")
    snap = snapshot_path(path, "c1")
    entered, release = threading.Event(), threading.Event()
    real_read = snapshot.read

    def held_read(*args: Any, **kwargs: Any) -> Any:
        found = real_read(*args, **kwargs)
        if threading.current_thread().name == "second-open":
            entered.set()  # the old file is mapped
            assert release.wait(60)
        return found

    monkeypatch.setattr(snapshot, "read", held_read)
    opened: list[SqliteVectorStore] = []
    second = threading.Thread(target=lambda: opened.append(open_store(path)), name="second-open")
    second.start()
    assert entered.wait(60)
    first = open_store(path)
    try:
        assert not snap.exists()  # the first removed it
        write(first, "S", ["BETA new text"], sha=CALLER_DIGEST)  # generation 2 again
        first.checkpoint()
        written = current_identity(snap)
        assert written is not None
        release.set()
        second.join(60)
        assert opened, "the second worker did not open"
        assert current_identity(snap) == written  # left as the first wrote it
        expected = from_sqlite(path)
        assert served(first) == served(opened[0]) == expected
    finally:
        release.set()
        first.close()
        for store in opened:
            store.close()
    assert markers_on_disk(path) == {"KEEPSECRET": [snap.name]}  # keep@r1 is live


def test_a_snapshot_past_the_database_found_at_a_write_is_replaced(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The open removes such a file; one put back later (store files copied in under a
    # running host) must not stop every rewrite either, a delete's among them.
    snap = snapshot_path(path, "c1")
    restored(path, tmp_path / "backup.sqlite")
    future = snap.read_bytes()
    with open_store(path) as store:
        assert not snap.exists()
        place(snap, future)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=SNAPSHOT_LOG):
            store.delete_source("c1", "ns", "keep", "r1")
            wait_until_gone(snap, "ALPHA", "the delete's rewrite")
        assert markers_on_disk(path) == {}
        assert "past the database's 2: replaced" in caplog.text

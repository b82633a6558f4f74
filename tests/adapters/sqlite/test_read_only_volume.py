"""A read-only store on a volume that cannot be written (a snapshot mount, a read-only
volume): opened as an immutable file, it serves searches and writes nothing beside it."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, unit_vectors


def _store_copy(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A store written and closed cleanly, then copied to a folder of its own (a snapshot)."""
    origin = tmp_path / "origin"
    origin.mkdir(mode=0o700)
    vectors = unit_vectors(np.random.default_rng(3), 3)
    with SqliteVectorStore.open(origin / "index.db") as writer:
        writer.open_corpus(descriptor("c1"))
        source, chunks = revision("doc", "r1", vectors, texts=["alpha", "beta", "gamma"])
        writer.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
    copy = tmp_path / "snapshot"
    copy.mkdir(mode=0o700)
    for item in origin.iterdir():
        if item.is_file():
            shutil.copyfile(item, copy / item.name)
    return copy / "index.db", vectors


def _unwritable(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    # As a read-only mount answers access(2) (tests run as root, whom permissions never stop).
    real = os.access

    def access(path: object, mode: int, **kwargs: object) -> bool:
        if Path(str(path)) == folder and mode & os.W_OK:
            return False
        return real(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)


def test_a_read_only_store_on_an_unwritable_volume_is_served_as_an_immutable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box test: on a read-only mount `readOnly: true` refused to open at all
    # (SQLite could not make the shared-memory file a WAL database needs).
    db, vectors = _store_copy(tmp_path)
    _unwritable(monkeypatch, db.parent)
    before = sorted(p.name for p in db.parent.iterdir())
    with SqliteVectorStore.open(db, read_only=True) as reader:
        reader.open_corpus(descriptor("c1"))
        found: list[str] = []
        # Searches read on a thread's own connection, opened immutable as well.
        searching = threading.Thread(
            target=lambda: found.extend(
                h.chunk_id
                for h in reader.search("c1", "ns", {"doc": "r1"}, vectors[2], 1, CancelToken())
            )
        )
        searching.start()
        searching.join()
        assert found == ["doc:2"]
    assert sorted(p.name for p in db.parent.iterdir()) == before  # no -wal, no -shm


@pytest.mark.parametrize("sidecar", ["-wal", "-shm"])
def test_a_read_only_store_a_host_may_still_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sidecar: str
) -> None:
    # An immutable file is read without locks or its log: a live store mounted read-only, or
    # a copy of one that did not stop cleanly, would be read stale.
    db, _ = _store_copy(tmp_path)
    db.with_name(db.name + sidecar).write_bytes(b"")
    _unwritable(monkeypatch, db.parent)
    with pytest.raises(RetrievalError) as refused:
        SqliteVectorStore.open(db, read_only=True)
    assert refused.value.code is ErrorCode.STORE_UNAVAILABLE
    assert f"has a {sidecar} file beside it" in refused.value.detail

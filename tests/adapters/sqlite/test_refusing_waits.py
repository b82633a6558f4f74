"""The SQLite store on a thread refusing waits (`core.waits`, the event loop's searches): a
reload after another connection's commit and a lock a writer holds are refused, not waited
for; the same calls on other threads wait and answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.ports import CapacityLimits
from retrieval_host.core.waits import WouldWait, refusing_waits
from tests.support.sqlite_store import descriptor, revision, unit_vectors

LIMITS = CapacityLimits()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteVectorStore]:
    with SqliteVectorStore.open(tmp_path / "store.db") as s:
        s.open_corpus(descriptor("c1"))
        source, chunks = revision("a", "r1", unit_vectors(np.random.default_rng(1), 3))
        s.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
        yield s


def test_a_fresh_index_answers_a_refusing_thread(store: SqliteVectorStore) -> None:
    query = unit_vectors(np.random.default_rng(2), 1)[0]
    with refusing_waits():
        hits = store.search("c1", "ns", {"a": "r1"}, query, 5, CancelToken())
        source = store.get_source("c1", "ns", "a")
        current = store.current_revisions("c1", "ns")
    assert len(hits) == 3
    assert source is not None and source.revision == "r1"
    assert current == {"a": "r1"}


def test_a_reload_after_another_connections_commit_is_refused_then_done_elsewhere(
    store: SqliteVectorStore, tmp_path: Path
) -> None:
    query = unit_vectors(np.random.default_rng(2), 1)[0]
    with SqliteVectorStore.open(tmp_path / "store.db") as other:
        other.open_corpus(descriptor("c1"))
        source, chunks = revision("b", "r1", unit_vectors(np.random.default_rng(3), 2))
        other.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    allowed = {"a": "r1", "b": "r1"}
    with refusing_waits():
        for call in (
            lambda: store.search("c1", "ns", allowed, query, 5, CancelToken()),
            lambda: store.lexical_search("c1", "ns", allowed, ["b"], 5, CancelToken()),
            lambda: store.current_revisions("c1", "ns"),
        ):
            with pytest.raises(WouldWait, match="reload"):
                call()
    # Not refusing (a search thread): the reload happens and the new source is found.
    assert len(store.search("c1", "ns", allowed, query, 5, CancelToken())) == 5
    with refusing_waits():  # and then the loop may read again
        assert store.current_revisions("c1", "ns") == allowed


@pytest.mark.parametrize("which", ["connection", "index"])
def test_a_lock_a_writer_holds_is_refused_on_a_refusing_thread(
    store: SqliteVectorStore, which: str
) -> None:
    # The store's connection lock, as a writer holds it through a commit (and SQLite's busy
    # wait for another process's write lock), which `get_source` takes (searches naming their
    # sources); and the index lock every search takes, held while a commit is applied.
    query = unit_vectors(np.random.default_rng(2), 1)[0]
    lock: Any = store._db_lock if which == "connection" else store._cache_lock

    def call() -> object:
        if which == "connection":
            return store.get_source("c1", "ns", "a")
        return store.search("c1", "ns", {"a": "r1"}, query, 5, CancelToken())

    taken, release = threading.Event(), threading.Event()

    def writer() -> None:
        with lock:
            taken.set()
            assert release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(writer)
        assert taken.wait(30)
        with refusing_waits(), pytest.raises(WouldWait, match="the store's"):
            call()
        waiting = pool.submit(call)  # another thread waits for the writer
        assert not waiting.done() or waiting.exception() is None
        release.set()
        held.result(timeout=30)
        assert waiting.result(timeout=30)

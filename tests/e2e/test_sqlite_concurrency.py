"""Racing writers on one source: one wins each race, the others get a typed conflict, and
readers (on the writers' store and on another connection) only ever see whole revisions."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, revision_text, unit_vectors

WRITERS = 8
ROUNDS = 8
SOURCE = "doc"
LIMITS = CapacityLimits()


def planned_count(rev: str) -> int:
    """Chunk count of a revision (distinct sizes, so a torn read would show)."""
    if rev == "r0":
        return 3
    writer, round_number = (int(x) for x in rev[1:].split("-"))
    return 1 + (writer * 5 + round_number * 3) % 17


def test_racing_writers_conflict_and_readers_see_whole_revisions(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    stores = [SqliteVectorStore.open(path), SqliteVectorStore.open(path)]
    reader_store = SqliteVectorStore.open(path)  # another connection, only reading
    for s in (*stores, reader_store):
        s.open_corpus(descriptor("c1"))
    rng = np.random.default_rng(0)
    source, chunks = revision(SOURCE, "r0", unit_vectors(rng, planned_count("r0")))
    stores[0].replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)

    # Vectors are prepared up front so the threads only race on the store.
    prepared = {
        f"w{w}-{r}": unit_vectors(rng, planned_count(f"w{w}-{r}"))
        for w in range(WRITERS)
        for r in range(ROUNDS)
    }
    start_round = threading.Barrier(WRITERS)
    done = threading.Event()
    lock = threading.Lock()
    wins: list[tuple[str, str]] = []  # (expected revision, new revision)
    conflicts: list[tuple[str, ErrorCode, str | None]] = []
    failures: list[BaseException] = []
    reads = {"whole": 0, "stale": 0}

    def write(w: int) -> None:
        store = stores[w % 2]  # half the writers share each store instance
        try:
            for r in range(ROUNDS):
                start_round.wait(timeout=30)
                current = store.get_source("c1", "ns", SOURCE)
                assert current is not None
                rev = f"w{w}-{r}"
                src, chs = revision(SOURCE, rev, prepared[rev])
                try:
                    store.replace_source(
                        "c1", "ns", src, chs, expected_revision=current.revision, limits=LIMITS
                    )
                except RetrievalError as exc:
                    with lock:
                        conflicts.append((rev, exc.code, exc.reason))
                else:
                    with lock:
                        wins.append((current.revision, rev))
        except BaseException as exc:
            failures.append(exc)
            start_round.abort()

    def read(store: SqliteVectorStore) -> None:
        query = unit_vectors(np.random.default_rng(1), 1)[0]
        try:
            while not done.is_set():
                current = store.get_source("c1", "ns", SOURCE)
                assert current is not None
                hits = store.search(
                    "c1", "ns", {SOURCE: current.revision}, query, 1000, CancelToken()
                )
                if not hits:  # replaced between the two reads: the grant names a stale one
                    with lock:
                        reads["stale"] += 1
                    continue
                count = planned_count(current.revision)
                assert {h.revision for h in hits} == {current.revision}
                assert current.chunk_count == count == len(hits)
                assert sorted(h.text for h in hits) == sorted(
                    revision_text(SOURCE, current.revision, i, count) for i in range(count)
                )
                with lock:
                    reads["whole"] += 1
        except BaseException as exc:
            failures.append(exc)

    writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    readers = [threading.Thread(target=read, args=(s,)) for s in (stores[0], reader_store)]
    for t in (*readers, *writers):
        t.start()
    for t in writers:
        t.join(timeout=60)
    done.set()
    for t in readers:
        t.join(timeout=60)
    for s in (*stores, reader_store):
        s.close()

    assert failures == []
    assert len(wins) + len(conflicts) == WRITERS * ROUNDS
    assert len(wins) >= ROUNDS  # the first writer of every round wins
    # ...and the racers lose with a typed conflict.
    assert conflicts
    assert {(code, reason) for _, code, reason in conflicts} == {
        (ErrorCode.SOURCE_CONFLICT, "concurrent-writer")
    }
    # No lost update: the wins form one chain from r0, each revision replaced exactly once.
    successor = dict(wins)
    assert len(successor) == len(wins)
    chain, at = [], "r0"
    while at in successor:
        at = successor[at]
        chain.append(at)
    assert len(chain) == len(wins)
    with SqliteVectorStore.open(path) as fresh:
        final = fresh.get_source("c1", "ns", SOURCE)
    assert final is not None
    assert final.revision == chain[-1]
    assert reads["whole"] > 0

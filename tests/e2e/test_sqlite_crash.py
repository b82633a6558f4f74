"""A writer killed with SIGKILL at random moments never leaves a torn revision behind."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import apsw
import numpy as np

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from tests.support.sqlite_crash_writer import (
    CORPUS,
    DIM,
    NAMESPACE,
    SOURCES,
    chunk_count,
    expected_texts,
)
from tests.support.sqlite_store import descriptor

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLS = 20
# How long the writer may go without reporting a commit (its start, imports included): only a
# hang takes this long. A deadline for all the commits awaited at once (30 s for up to 12 rounds
# of 4 sources) failed once under three concurrent test runs, the writer still committing.
PROGRESS_TIMEOUT_S = 60.0


def read_commits(proc: subprocess.Popen[bytes], count: int, stderr_path: Path) -> list[str]:
    """Block until the child has reported `count` more commits (or fail if it dies, or
    reports nothing for `PROGRESS_TIMEOUT_S`)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: list[str] = []
    pending = b""
    while len(lines) < count:
        ready, _, _ = select.select([fd], [], [], PROGRESS_TIMEOUT_S)
        assert ready, "the writer reported no progress in time"
        data = os.read(fd, 65536)
        assert data, f"the writer exited: {stderr_path.read_text()}"
        pending += data
        *complete, pending = pending.split(b"\n")
        lines += [line.decode() for line in complete]
    return lines


def check_database(path: Path) -> dict[str, str]:
    """Independent of the store's code: integrity, and each source one complete revision."""
    conn = apsw.Connection(str(path))  # recovers the WAL the killed writer left
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        current: dict[str, str] = {}
        rows = conn.execute(
            "SELECT id, source_id, revision, chunk_count FROM sources "
            "WHERE corpus_id = ? AND namespace = ?",
            (CORPUS, NAMESPACE),
        ).fetchall()
        for pk, source_id, rev, count in rows:
            texts = [
                t
                for (t,) in conn.execute(
                    "SELECT text FROM chunks WHERE source_pk = ? ORDER BY ordinal", (pk,)
                )
            ]
            assert count == chunk_count(str(source_id), str(rev))
            assert texts == expected_texts(str(source_id), str(rev)), (source_id, rev)
            current[str(source_id)] = str(rev)
        total = conn.execute("SELECT COUNT(*) FROM chunks").fetchall()[0][0]
        assert total == sum(chunk_count(s, r) for s, r in current.items())
        return current
    finally:
        conn.close()


def check_through_the_store(path: Path, current: dict[str, str]) -> None:
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor(CORPUS, dimensions=DIM))
        query = np.ones(DIM, dtype=np.float32)
        hits = store.search(CORPUS, NAMESPACE, current, query, 10_000, CancelToken())
        for source_id, rev in current.items():
            texts = sorted(h.text for h in hits if h.source_id == source_id)
            assert texts == sorted(expected_texts(source_id, rev))
            assert {h.revision for h in hits if h.source_id == source_id} == {rev}


def test_sigkill_at_random_moments_leaves_whole_revisions(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    chance = random.Random(20260417)
    reported: dict[str, int] = {}  # source -> last round the writer said it committed
    for kill in range(KILLS):
        stderr_path = tmp_path / f"writer-{kill}.err"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.sqlite_crash_writer",
                    str(db),
                    str(kill * 10**6),
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        try:
            for line in read_commits(proc, chance.randint(1, 12), stderr_path):
                source_id, rev = line.split()
                reported[source_id] = int(rev[1:])
            time.sleep(chance.uniform(0.0, 0.015))  # land the kill anywhere in the next write
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()

        current = check_database(db)
        # Nothing the writer reported as committed was lost.
        for source_id, round_number in reported.items():
            assert int(current[source_id][1:]) >= round_number
        check_through_the_store(db, current)

    assert set(reported) == set(SOURCES)

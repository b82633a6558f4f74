"""Writers racing to index one source: identical content under one revision is `unchanged`
however they interleave; only different content conflicts (issue 13, defect 7).

Four real processes per race, on one SQLite file or as four PostgreSQL connections. Each
child is held inside its embedding step, after it has read the current revision (none yet),
until all four are there: then all commit at once, so three of them find the source already
written by the winner — the interleaving that used to answer `SOURCE_CONFLICT`.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from retrieval_host.core.fingerprint import joined_text, revision_fingerprint, sha256_text
from tests.contract.conftest import StoreHarness
from tests.support.pg import schema_for, shared_dsn
from tests.support.racing_indexer import CORPUS, NAMESPACE, SOURCE, corpus, request

REPO = Path(__file__).resolve().parents[2]
WRITERS = 4
# Generous: under a loaded machine starting four interpreters can take long; nothing waits
# this long unless a child is stuck.
DEADLINE_S = 120.0


def _read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "a racing writer reported nothing in time"
    line = proc.stdout.readline()
    assert line, f"a racing writer exited early (status {proc.wait()})"
    return line.strip()


def race(harness: StoreHarness, tags: list[str]) -> list[str]:
    """Run one writer per tag, release them together; their outcomes, in tag order."""
    # The corpus exists before the race: the children only race on the source.
    store = harness.open()
    store.open_corpus(corpus(store).descriptor)
    if harness.kind == "sqlite":
        target = ["sqlite", str(harness.location / "store.db")]
    else:
        target = ["pgvector", shared_dsn(), schema_for(harness.location)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.racing_indexer", *target, tag],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for tag in tags
    ]
    try:
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:  # every writer has read the source and is about to commit
            assert _read_line(proc, deadline) == "embedding"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes = [_read_line(proc, deadline) for proc in procs]
        for proc in procs:
            assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
        return outcomes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def test_four_writers_indexing_identical_content_get_one_indexed_and_three_unchanged(
    harness: StoreHarness,
) -> None:
    outcomes = race(harness, ["first"] * WRITERS)
    assert Counter(outcomes) == {"result indexed": 1, "result unchanged": WRITERS - 1}
    stored = harness.open().get_source(CORPUS, NAMESPACE, SOURCE)
    assert stored is not None and stored.revision == "r1" and stored.chunk_count == 3


def test_different_content_under_one_revision_still_conflicts_however_the_race_goes(
    harness: StoreHarness,
) -> None:
    tags = ["first", "first", "second", "second"]
    outcomes = race(harness, tags)
    winner = tags[outcomes.index("result indexed")]
    assert outcomes.count("result indexed") == 1
    for tag, outcome in zip(tags, outcomes, strict=True):
        if outcome == "result indexed":
            continue
        if tag == winner:
            assert outcome == "result unchanged"
        else:
            assert outcome == "error SOURCE_CONFLICT revision-content-differs"
    stored = harness.open().get_source(CORPUS, NAMESPACE, SOURCE)
    assert stored is not None
    assert stored.revision == "r1"
    expected = request(winner)
    digest = sha256_text(joined_text(expected.chunks))
    assert stored.fingerprint == revision_fingerprint(expected.source, expected.chunks, digest)

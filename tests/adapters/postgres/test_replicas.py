"""Several host replicas, each its own OS process, sharing one PostgreSQL database.

Each replica (`tests.support.pg_replica`) runs its own `PgVectorStore` and `RetrievalService`
with the real local embedding model. The test process drives them over pipes and looks at the
database directly, one statement (one snapshot) per observation.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import Connection, sql

from tests.support.pg import connect
from tests.support.pg_replica import CORPUS, NAMESPACE, ReplicaProcess


@pytest.fixture
def replicas(pg_dsn: str, pg_schema: str) -> Iterator[tuple[ReplicaProcess, ReplicaProcess]]:
    """Replicas `replica-a` and `replica-b` on the test's schema, started in parallel."""
    a = ReplicaProcess("replica-a", pg_dsn, pg_schema)
    b = ReplicaProcess("replica-b", pg_dsn, pg_schema)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.close()
        b.close()


def texts(source: str, revision: str, count: int) -> list[str]:
    return [f"Otter note {i} of {count} in {source} at revision {revision}." for i in range(count)]


@dataclass(frozen=True)
class Snapshot:
    """One source as one SQL statement saw it: its revisions and their chunk rows."""

    revisions: list[tuple[str, int, int, list[str]]]  # (revision, chunk_count, rows, texts)
    orphan_rows: int  # chunk rows of the source's ids that belong to no current revision


def snapshot(
    pg_dsn: str, schema: str, source: str, conn: Connection[tuple[Any, ...]] | None = None
) -> Snapshot:
    """Read one source in one statement (on `conn`, or a connection of its own)."""
    query = sql.SQL(
        "SELECT (SELECT coalesce(json_agg(json_build_array(s.revision, s.chunk_count, "
        "(SELECT count(*) FROM {s}.chunks c WHERE c.source_pk = s.id), "
        "(SELECT coalesce(json_agg(c.text ORDER BY c.ordinal), '[]') FROM {s}.chunks c "
        "WHERE c.source_pk = s.id))), '[]') FROM {s}.sources s "
        "WHERE s.corpus_id = %(corpus)s AND s.namespace = %(ns)s AND s.source_id = %(src)s), "
        "(SELECT count(*) FROM {s}.chunks c WHERE c.corpus_id = %(corpus)s "
        "AND c.namespace = %(ns)s AND c.chunk_id LIKE %(prefix)s AND NOT EXISTS ("
        "SELECT 1 FROM {s}.sources s WHERE s.id = c.source_pk AND s.source_id = %(src)s))"
    ).format(s=sql.Identifier(schema))
    params = {"corpus": CORPUS, "ns": NAMESPACE, "src": source, "prefix": f"{source}-%"}
    if conn is None:
        with connect(pg_dsn) as own:
            row = own.execute(query, params).fetchone()
    else:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    revisions = [(str(r[0]), int(r[1]), int(r[2]), list(r[3])) for r in row[0]]
    return Snapshot(revisions, int(row[1]))


def assert_one_complete_revision(snap: Snapshot, expected: dict[str, list[str]]) -> str:
    """Exactly one revision, with every one of its passages and nothing else."""
    assert snap.orphan_rows == 0, snap
    assert len(snap.revisions) == 1, snap
    revision, count, rows, stored = snap.revisions[0]
    assert revision in expected, snap
    assert count == rows == len(expected[revision]), snap
    assert stored == expected[revision], snap
    return revision


def test_an_index_through_one_replica_is_searchable_through_the_other_at_once(
    replicas: tuple[ReplicaProcess, ReplicaProcess],
) -> None:
    a, b = replicas
    first = texts("otters", "r1", 3)
    assert a.call({"op": "index", "source": "otters", "revision": "r1", "texts": first}) == {
        "ok": True,
        "revision": "r1",
        "status": "indexed",
        "replaced": None,
    }
    # As soon as A answered, B finds every passage (no cache to warm, no delay).
    found = b.call({"op": "search", "grant": {"otters": "r1"}, "query": "otter note", "limit": 10})
    assert found["ok"]
    assert sorted(h["text"] for h in found["hits"]) == sorted(first)
    assert {h["revision"] for h in found["hits"]} == {"r1"}

    # A repeated identical index through B is confirmed unchanged (the record is shared).
    again = b.call({"op": "index", "source": "otters", "revision": "r1", "texts": first})
    assert again["status"] == "unchanged"

    second = texts("otters", "r2", 2)
    changed = b.call({"op": "index", "source": "otters", "revision": "r2", "texts": second})
    assert (changed["status"], changed["replaced"]) == ("indexed", "r1")
    now = a.call({"op": "search", "grant": {"otters": "r2"}, "query": "otter note"})
    assert sorted(h["text"] for h in now["hits"]) == sorted(second)
    old = a.call({"op": "search", "grant": {"otters": "r1"}, "query": "otter note"})
    assert old == {"ok": True, "hits": []}

    stale = a.call({"op": "index", "source": "otters", "revision": "r2", "texts": first})
    assert (stale["ok"], stale["code"]) == (False, "SOURCE_CONFLICT")


def test_eight_writers_across_two_replicas_leave_one_complete_revision_at_every_read(
    pg_dsn: str, pg_schema: str, replicas: tuple[ReplicaProcess, ReplicaProcess]
) -> None:
    a, b = replicas
    expected = {"r0": texts("race", "r0", 2)}
    assert a.call({"op": "index", "source": "race", "revision": "r0", "texts": expected["r0"]})[
        "ok"
    ]
    writes = []
    for i in range(8):
        revision = f"w{i}"
        expected[revision] = texts("race", revision, 2 + i)  # a distinct size per revision
        writes.append({"revision": revision, "texts": expected[revision]})

    assert a.call({"op": "race", "source": "race", "writes": writes[:4]})["armed"] == 4
    assert b.call({"op": "race", "source": "race", "writes": writes[4:]})["armed"] == 4

    seen: list[str] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            with connect(pg_dsn) as conn:  # autocommit: every statement is a new snapshot
                while not stop.is_set():
                    snap = snapshot(pg_dsn, pg_schema, "race", conn)
                    seen.append(assert_one_complete_revision(snap, expected))
        except BaseException as exc:
            failure.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        a.send({"op": "go"})
        b.send({"op": "go"})
        results: list[dict[str, Any]] = a.receive(90)["results"] + b.receive(90)["results"]
    finally:
        stop.set()
        reader.join(timeout=30)
    assert not failure, failure[0]
    assert len(seen) >= 5

    assert len(results) == 8
    winners = [r for r in results if r["ok"]]
    losers = [r for r in results if not r["ok"]]
    assert winners
    assert all((r["code"], r["reason"]) == ("SOURCE_CONFLICT", "concurrent-writer") for r in losers)
    # The winners form one history from r0: each replaced exactly the revision before it.
    replaced = [w["replaced"] for w in winners]
    assert len(set(replaced)) == len(replaced), "two writers replaced the same revision"
    chain = {w["replaced"]: w["revision"] for w in winners}
    current = "r0"
    while current in chain:
        current = chain.pop(current)
    assert not chain, "a winner replaced a revision that was never current"
    final = assert_one_complete_revision(snapshot(pg_dsn, pg_schema, "race"), expected)
    assert final == current
    assert set(seen) <= {"r0", *(w["revision"] for w in winners)}


def test_a_replica_killed_mid_index_leaves_the_old_or_the_new_revision_never_a_mix(
    pg_dsn: str, pg_schema: str, replicas: tuple[ReplicaProcess, ReplicaProcess]
) -> None:
    a, _ = replicas
    count = 20_000
    old = [f"big r1 passage {i} of {count}" for i in range(count)]
    new = [f"big r2 passage {i} of {count}" for i in range(count)]
    assert a.call({"op": "replace_big", "source": "big", "revision": "r1", "count": count}, 120)[
        "ok"
    ]

    a.send({"op": "replace_big", "source": "big", "revision": "r2", "count": count,
            "expected": "r1"})  # fmt: skip
    # Poll until A's transaction has copied at least half of the new passages, then kill it.
    copied = 0
    deadline = time.monotonic() + 60
    with connect(pg_dsn) as conn:
        while copied < count // 2:
            assert time.monotonic() < deadline, f"the copy never got half way ({copied})"
            row = conn.execute(
                "SELECT p.tuples_processed FROM pg_stat_progress_copy p "
                "JOIN pg_stat_activity s ON s.pid = p.pid WHERE s.application_name = %s",
                ("replica-a",),
            ).fetchone()
            copied = int(row[0]) if row is not None else 0
        assert a.pid is not None
        os.kill(a.pid, signal.SIGKILL)
        a.proc.wait(timeout=30)
        # The server notices the dead client and aborts its transaction.
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", ("replica-a",)
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "replica-a's backends outlived it"
            time.sleep(0.02)

    mid = snapshot(pg_dsn, pg_schema, "big")
    assert assert_one_complete_revision(mid, {"r1": old, "r2": new}) == "r1"

    # Killed right after a commit instead: the new revision stays, whole.
    c = ReplicaProcess("replica-c", pg_dsn, pg_schema)
    try:
        c.wait_ready()
        assert c.call(
            {"op": "replace_big", "source": "big", "revision": "r2", "count": count,
             "expected": "r1"},
            120,
        )["ok"]  # fmt: skip
        assert c.pid is not None
        os.kill(c.pid, signal.SIGKILL)
        c.proc.wait(timeout=30)
    finally:
        c.close()
    after = snapshot(pg_dsn, pg_schema, "big")
    assert assert_one_complete_revision(after, {"r1": old, "r2": new}) == "r2"

"""kill -9 trials of the quickstart's example application with concurrent writers.

Used by `tests/e2e/test_example_app_crash.py` (a few trials) and `scripts/crash_trials.py`
(50 trials, prints the figures). Each trial starts `WRITERS` writer processes
(`tests.support.example_app_writer`, the example application built by `create_driver` as the
host and `retrieval-host ingest` build it) on one SQLite store, lets them all write, and kills
each with SIGKILL at a random moment inside one of its operations (between `try` and `ack`:
embedding, the commit, or right after it). Then, with no writer left:

- `PRAGMA integrity_check` and `foreign_key_check` on the database;
- every acknowledged write is present: each source is at its last acknowledged state, or at
  the state of the operation that was in flight when its writer died;
- every stored source is searchable and deletable through a driver built once before the
  first trial (a host that kept running while writers died around it), and through a driver
  built afresh at the end (a restarted host); one source per trial is really deleted.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import DeleteRequest, SearchRequest
from retrieval_host.core.ports import AuthorizationRequest
from retrieval_host.driver import Driver
from retrieval_host.example_acl import acl_file_content
from retrieval_host.serving.factory import build_driver
from retrieval_host.settings import load_settings
from tests.support.example_app_writer import (
    CORPUS,
    NAMESPACE,
    SUBJECT,
    passages,
    sources_of,
)

REPO = Path(__file__).resolve().parents[2]
WRITERS = 3
# Bounds for waiting on a child; only reached if one is stuck (model loading under a loaded
# machine can take several seconds).
READY_TIMEOUT_S = 180.0
PROGRESS_TIMEOUT_S = 60.0

# A source's state: its revision, or None when absent.
State = str | None


@dataclass
class Figures:
    trials: int = 0
    writers_killed: int = 0
    acknowledged: int = 0
    killed_mid_operation: int = 0
    in_flight_applied: int = 0
    sources_checked: int = 0
    unsearchable: int = 0
    undeletable: int = 0
    acknowledged_missing: int = 0
    deletes_by_the_host: int = 0
    writer_failures: int = 0
    integrity: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and self.unsearchable == self.undeletable == self.acknowledged_missing == 0
            and self.writer_failures == 0
            and set(self.integrity) == {"ok"}
        )

    def lines(self) -> list[str]:
        return [
            f"trials: {self.trials} ({WRITERS} concurrent writers each, all killed with SIGKILL)",
            f"writers killed: {self.writers_killed}, "
            f"killed inside an operation: {self.killed_mid_operation} "
            f"(of which the store had committed: {self.in_flight_applied})",
            f"acknowledged writes: {self.acknowledged}, "
            f"missing after the kills: {self.acknowledged_missing}",
            f"source checks: {self.sources_checked}, unsearchable: {self.unsearchable}, "
            f"undeletable: {self.undeletable}, deleted by the running host: "
            f"{self.deletes_by_the_host}, writers' operations refused: {self.writer_failures}",
            "integrity_check: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.integrity.items())),
            *(f"problem: {p}" for p in self.problems),
        ]


EXAMPLE_APPLICATION = "retrieval_host.example_acl:create_driver"


def prepare_state(directory: Path, application: str = EXAMPLE_APPLICATION) -> Path:
    """The quickstart's application configuration (no TLS: nothing is served). `registryFile`
    is what earlier versions of the example application kept revisions in (now ignored)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    (directory / "acl.json").write_text(json.dumps(acl_file_content(SUBJECT, NAMESPACE)))
    config = directory / "host.json"
    config.write_text(
        json.dumps(
            {
                "listen": {"host": "127.0.0.1", "port": 8443},
                "behindProxy": True,
                "store": {"sqlitePath": "store/retrieval.sqlite"},
                "application": application,
                "applicationOptions": {
                    "aclFile": "acl.json",
                    "registryFile": "registry.json",
                    "corpora": [CORPUS],
                },
            }
        )
    )
    return config


class Writer:
    """One writer process and what it reported."""

    def __init__(self, config: Path, number: int, seed: int, log: Path) -> None:
        self.number = number
        argv = [str(config), str(number), str(seed)]
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.example_app_writer", *argv],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.log = log
        self.pending = b""
        self.lines: list[str] = []
        self.arrived: list[float] = []  # when the parent read each line
        self.eof = False

    def pump(self) -> None:
        """Read what is available now (call after select said so)."""
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
            return
        self.pending += data
        *complete, self.pending = self.pending.split(b"\n")
        self.lines += [line.decode() for line in complete]
        self.arrived += [time.monotonic()] * len(complete)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert not self.eof, f"writer {self.number} exited: {self.log.read_text()[-2000:]}"
            left = deadline - time.monotonic()
            assert left > 0, f"writer {self.number} made no progress in time"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                self.pump()

    def acked(self) -> int:
        """Operations that ended (acknowledged or refused)."""
        return sum(1 for line in self.lines if line.startswith(("ack ", "fail ")))

    def tries(self) -> int:
        return sum(1 for line in self.lines if line.startswith("try "))

    def operation_s(self) -> float:
        """The median time from `try` to `ack` seen so far (what a kill has to land in)."""
        spans = sorted(
            self.arrived[i + 1] - self.arrived[i]
            for i in range(len(self.lines) - 1)
            if self.lines[i].startswith("try ") and self.lines[i + 1].startswith(("ack ", "fail "))
        )
        return spans[len(spans) // 2] if spans else 0.02

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        while not self.eof:  # lines written before the kill are still in the pipe
            self.pump()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _after(op: str, rev: str) -> State:
    """A source's state after an index (its revision) or a delete (absent)."""
    return rev if op == "index" else None


def _integrity(path: Path) -> str:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        result = ";".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
        if conn.execute("PRAGMA foreign_key_check").fetchall():
            result += ";foreign-key-violations"
        return result
    finally:
        conn.close()


def _stored(path: Path) -> dict[str, str]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {
            str(sid): str(rev)
            for sid, rev in conn.execute(
                "SELECT source_id, revision FROM sources WHERE corpus_id = ? AND namespace = ?",
                (CORPUS, NAMESPACE),
            )
        }
    finally:
        conn.close()


def _driver(config: Path) -> Driver:
    driver = build_driver(load_settings(config, {}), {})  # as `serve` and `ingest` do
    assert driver is not None
    return driver


def check_sources(driver: Driver, stored: dict[str, str], figures: Figures, who: str) -> None:
    """Every stored source is searchable, and its current revision is what a delete is
    granted (the delete's own precondition), through `driver`."""
    context = RequestContext(subject=SUBJECT)
    corpus = driver.retrieval.corpus(CORPUS)
    for source_id, rev in sorted(stored.items()):
        figures.sources_checked += 1
        try:
            found = driver.search_context(
                SearchRequest(CORPUS, passages(source_id, rev)[0], source_ids=[source_id]),
                context,
            )
            revisions = {hit.source.revision for hit in found.hits}
        except RetrievalError as exc:
            revisions = {f"error {exc.code.value}"}
        if revisions != {rev}:
            figures.unsearchable += 1
            figures.problems.append(f"{who}: {source_id}@{rev} searched: {sorted(revisions)}")
        grant = corpus.authorize(AuthorizationRequest("delete", CORPUS, (source_id,)), context)
        if grant is None or grant.sources.get(source_id) != rev:
            figures.undeletable += 1
            granted = None if grant is None else grant.sources.get(source_id)
            figures.problems.append(f"{who}: {source_id}@{rev} delete granted {granted}")


def delete_one(driver: Driver, stored: dict[str, str], chance: random.Random, fig: Figures) -> None:
    if not stored:
        return
    source_id = chance.choice(sorted(stored))
    try:
        driver.delete_context(
            DeleteRequest(CORPUS, source_id, stored[source_id]), RequestContext(subject=SUBJECT)
        )
        fig.deletes_by_the_host += 1
    except RetrievalError as exc:
        fig.undeletable += 1
        fig.problems.append(f"host: delete {source_id}@{stored[source_id]}: {exc.code.value}")


def run_trials(
    directory: Path,
    trials: int,
    *,
    seed: int = 20261201,
    application: str = EXAMPLE_APPLICATION,
    progress: Callable[[str], Any] | None = None,
) -> Figures:
    """`trials` kill -9 trials in `directory` (created); the figures, problems listed."""
    config = prepare_state(directory, application)
    database = directory / "store" / "retrieval.sqlite"
    chance = random.Random(seed)
    figures = Figures()
    host = _driver(config)  # keeps running through every trial
    try:
        for trial in range(trials):
            before: dict[str, State] = dict(_stored(database))
            writers = [
                Writer(config, n, seed + trial * WRITERS + n, directory / f"w{trial}-{n}.err")
                for n in range(WRITERS)
            ]
            try:
                for w in writers:
                    w.wait_for(lambda w=w: "ready" in w.lines, READY_TIMEOUT_S)  # type: ignore[misc]
                # Let all of them write, then kill each inside an operation at a random moment.
                order = list(writers)
                chance.shuffle(order)
                for w in order:
                    target = w.acked() + chance.randint(1, 4)
                    w.wait_for(lambda w=w, t=target: w.acked() >= t, PROGRESS_TIMEOUT_S)  # type: ignore[misc]
                    w.wait_for(lambda w=w: w.tries() > w.acked(), PROGRESS_TIMEOUT_S)  # type: ignore[misc]
                    # Land anywhere in that operation; every other kill in its last half,
                    # where the commit and whatever follows it run (embedding comes first).
                    low = 0.0 if chance.random() < 0.5 else 0.5
                    time.sleep(chance.uniform(low, 1.1) * w.operation_s())
                    w.kill()
                    figures.writers_killed += 1
            finally:
                for w in writers:
                    w.close()

            integrity = _integrity(database)
            figures.integrity[integrity] = figures.integrity.get(integrity, 0) + 1
            stored = _stored(database)
            for w in writers:
                # Replay what this writer reported over the state the trial started from.
                acknowledged = {s: before.get(s) for s in sources_of(w.number)}
                in_flight: list[str] | None = None
                for line in w.lines:
                    kind, *rest = line.split()
                    if kind == "try":
                        in_flight = rest
                    elif kind == "ack":
                        figures.acknowledged += 1
                        acknowledged[rest[1]] = _after(rest[0], rest[2])
                        in_flight = None
                    elif kind == "fail":  # a writer refused its own source's current revision
                        figures.writer_failures += 1
                        if rest[0] == "delete":
                            figures.undeletable += 1
                        figures.problems.append(f"trial {trial}: writer: {line}")
                        in_flight = None
                allowed = {s: {state} for s, state in acknowledged.items()}
                if in_flight is not None:
                    figures.killed_mid_operation += 1
                    op, source_id, rev = in_flight
                    allowed[source_id].add(_after(op, rev))
                    if stored.get(source_id) == _after(op, rev) != acknowledged[source_id]:
                        figures.in_flight_applied += 1
                for source_id, states in allowed.items():
                    if stored.get(source_id) not in states:
                        figures.acknowledged_missing += 1
                        figures.problems.append(
                            f"trial {trial}: {source_id} stored {stored.get(source_id)}, "
                            f"acknowledged {sorted(map(str, states))}"
                        )
            check_sources(host, stored, figures, f"trial {trial} running host")
            delete_one(host, stored, chance, figures)
            figures.trials += 1
            if progress is not None:
                progress(
                    f"trial {trial + 1}/{trials}: {len(stored)} sources, "
                    f"{figures.unsearchable} unsearchable, {figures.undeletable} undeletable, "
                    f"{figures.acknowledged_missing} missing, integrity {integrity}"
                )
        restarted = _driver(config)
        try:
            check_sources(restarted, _stored(database), figures, "restarted host")
        finally:
            restarted.close()
    finally:
        host.close()
    return figures

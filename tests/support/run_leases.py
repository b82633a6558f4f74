"""What the run-lease tests of both stores share: a host process killed in the middle of a run,
and the checks made on the records it leaves (`adapters.run_leases`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from retrieval_host.adapters.run_leases import INTERRUPTED
from retrieval_host.adapters.wiring import RecordStore
from retrieval_host.core.run_ports import RunRecord, RunStore
from tests.support.host import wait_until
from tests.support.run_records import a_result

# A process that opens a run store (`opening`, an expression of `SqliteRunStore` or
# `PgRunStore`), begins run `argv[1]` with key `argv[2]`, says so and waits to be killed.
_BEGIN_AND_WAIT = """\
import sys
from retrieval_host.adapters.postgres import PgRunStore
from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.run_ports import RunRecord
store = {opening}
record = RunRecord(sys.argv[1], "alice", sys.argv[2], "fp", "running", "t", provider="p")
assert store.begin(record) is None
print("begun", flush=True)
sys.stdin.read()
"""


def killed_mid_run(opening: str, run_id: str, key: str) -> None:
    """Begin `run_id` in another process, then SIGKILL it: a host that stopped mid-run."""
    with subprocess.Popen(
        [sys.executable, "-c", _BEGIN_AND_WAIT.format(opening=opening), run_id, key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "begun\n"
        finally:
            process.kill()
            process.wait(timeout=30)


def record(run_id: str, key: str | None = None) -> RunRecord:
    return RunRecord(run_id, "alice", key, "fp", "running", "t", provider="p")


def check_lapsed_run_reads_interrupted(store: RunStore, run_id: str, key: str) -> None:
    """The killed process's run reads `running` until its lease lapses, then `failed`,
    `INTERRUPTED`, through `get` and through its idempotency key alike."""
    wait_until(lambda: _status(store, run_id) != "running", timeout=60, what="the lease to lapse")
    lapsed = store.get(run_id)
    assert lapsed is not None
    assert (lapsed.status, lapsed.error_code, lapsed.result) == ("failed", INTERRUPTED, None)
    again = store.begin(record("run-retry", key))
    assert again is not None and again.run_id == run_id and again.status == "failed"
    # A new key runs, as the replay's refusal tells the caller to do.
    assert store.begin(record("run-fresh", key + "-new")) is None


def check_renewed_run_stays_running(
    beginner: RunStore, reader: RunStore, lease_s: float, lease_until: Callable[[str], float]
) -> None:
    """A run whose host renews its lease reads `running` to another store long after its
    first lease would have lapsed, its lease moving forward."""
    assert beginner.begin(record("run-live", "k-live")) is None
    first = lease_until("run-live")
    end = time.time() + 2.5 * lease_s
    while time.time() < end:
        assert _status(reader, "run-live") == "running"
        time.sleep(0.05)  # the subject is time passing: the lease must outlive it
    assert _status(reader, "run-live") == "running"
    assert lease_until("run-live") > first + lease_s
    beginner.complete("run-live", a_result("run-live"))
    done = reader.get("run-live")
    assert done is not None and done.status == "completed"


def check_close_interrupts_only_unfinished_runs(open_store: Callable[[], RecordStore]) -> None:
    """Closing a store marks its runs still going interrupted, and no other."""
    store = open_store()
    for run_id in ("run-going", "run-done", "run-failed"):
        assert store.begin(record(run_id, run_id)) is None
    store.complete("run-done", a_result("run-done"))
    store.finish("run-failed", "failed", "PROVIDER_FAILED")
    store.close()
    reopened = open_store()
    statuses = {}
    for run_id in ("run-going", "run-done", "run-failed"):
        got = reopened.get(run_id)
        assert got is not None
        statuses[run_id] = (got.status, got.error_code)
    assert statuses == {
        "run-going": ("failed", INTERRUPTED),
        "run-done": ("completed", None),
        "run-failed": ("failed", "PROVIDER_FAILED"),
    }


def _status(store: RunStore, run_id: str) -> str:
    got = store.get(run_id)
    assert got is not None
    return got.status


def check_stalled_host_result_replaces_the_mark(
    beginner: RunStore, reader: RunStore, lapse: Callable[[str], None]
) -> None:
    """A host that stalled past its lease (`lapse` moves the lease into the past, as a store
    unreachable that long would leave it): read as interrupted meanwhile, then its recorded
    result replaces the mark, error code included."""
    assert beginner.begin(record("run-stalled", "k-stalled")) is None
    lapse("run-stalled")
    marked = reader.get("run-stalled")
    assert marked is not None and (marked.status, marked.error_code) == ("failed", INTERRUPTED)
    beginner.complete("run-stalled", a_result("run-stalled"))
    done = reader.get("run-stalled")
    assert done is not None
    assert (done.status, done.error_code) == ("completed", None)
    assert done.result == a_result("run-stalled")
    # So does the way it failed, when it did.
    assert beginner.begin(record("run-stalled-2", "k-stalled-2")) is None
    lapse("run-stalled-2")
    marked = reader.get("run-stalled-2")
    assert marked is not None and marked.error_code == INTERRUPTED
    beginner.finish("run-stalled-2", "failed", "PROVIDER_FAILED")
    failed = reader.get("run-stalled-2")
    assert failed is not None
    assert (failed.status, failed.error_code) == ("failed", "PROVIDER_FAILED")

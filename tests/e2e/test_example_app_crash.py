"""kill -9 of the quickstart application's writers never hides a source (issue 13, defect 3).

Three writer processes build the example application as the host and `retrieval-host ingest`
do, write concurrently to one SQLite store, and are each killed with SIGKILL inside an
operation; a host built before the first trial keeps running throughout. A few trials here
(`scripts/crash_trials.py` runs 50 and prints the figures); see `tests.support.example_app_crash`.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.example_app_crash import WRITERS, run_trials

TRIALS = 5


def test_writers_killed_mid_operation_leave_every_source_searchable_and_deletable(
    tmp_path: Path,
) -> None:
    figures = run_trials(tmp_path / "state", TRIALS)
    assert figures.problems == []
    assert figures.trials == TRIALS
    assert figures.writers_killed == TRIALS * WRITERS
    assert figures.integrity == {"ok": TRIALS}
    assert figures.acknowledged > 0 and figures.sources_checked > 0
    assert figures.unsearchable == figures.undeletable == figures.acknowledged_missing == 0
    assert figures.writer_failures == 0
    assert figures.ok

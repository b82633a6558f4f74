"""kill -9 trials of the quickstart's example application (issue 13, defect 3); prints figures.

    .venv/bin/python scripts/crash_trials.py [--trials 50] [--seed N] [--keep DIR]
        [--application module:factory]

Each trial runs three writer processes (the example application, built as `serve` and
`retrieval-host ingest` build it) on one SQLite store and kills each with SIGKILL inside an
operation; then it checks integrity, that every acknowledged write is present, and that every
source is searchable and deletable through a host that kept running (and, at the end, through
a restarted one). See `tests/support/example_app_crash.py`. `--application` runs the same
trials against another factory, e.g. an earlier version of the example application kept
beside the config. Exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.example_app_crash import EXAMPLE_APPLICATION, run_trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--keep", type=Path, help="state directory to use and keep")
    parser.add_argument("--application", default=EXAMPLE_APPLICATION)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crash-trials-") as scratch:
        directory = args.keep if args.keep is not None else Path(scratch) / "state"
        started = time.monotonic()
        figures = run_trials(
            directory,
            args.trials,
            seed=args.seed,
            application=args.application,
            progress=lambda line: print(line, flush=True),
        )
        print()
        for line in figures.lines():
            print(line)
        print(
            f"elapsed: {time.monotonic() - started:.0f} s; result: "
            + ("ok" if figures.ok else "FAILED")
        )
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`retrieval-host runs prune`: delete run records (and usage records) older than a time.

retrieval-host runs prune --config host.json --before TIME [--usage] [--vacuum]

Run records keep each answer and its evidence manifest (titles, locations, quoted text) and
usage records what was spent, for good: a host serving a steady run rate grows its run store
without bound (2.5-4 KB a run), and deleting a source never reaches them (README, "What the
index does not do"). This is the supported way to expire them, beside a serving host: the
finished runs created before `--before` go (a running one stays), and with `--usage` the
usage records before it. A pruned run reads as the 404 of a run that never was, and its
idempotency key, used again, starts a new run. `--vacuum` (SQLite) then rewrites the file
without its free pages, so it shrinks; PostgreSQL's autovacuum makes the space reusable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.adapters.wiring import build_run_store, sqlite_runs_path
from retrieval_host.core.errors import RetrievalError
from retrieval_host.serving.usage_cli import instant
from retrieval_host.settings import SettingsError, load_settings


def add_command(commands: Any) -> None:
    runs = commands.add_parser("runs", help="expire run records")
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    prune = actions.add_parser(
        "prune", help="delete the finished runs (and, with --usage, usage records) before a time"
    )
    prune.add_argument("--config", required=True, type=Path, help="host configuration JSON")
    prune.add_argument(
        "--before",
        required=True,
        type=instant,
        help="delete what was recorded before this time: RFC 3339 (2026-12-01T00:00:00Z, an "
        "offset is converted to UTC) or a date (2026-12-01, midnight UTC)",
    )
    prune.add_argument(
        "--usage", action="store_true", help="also delete the usage records before that time"
    )
    prune.add_argument(
        "--vacuum",
        action="store_true",
        help="then shrink the SQLite file (VACUUM: it locks the run store throughout, ~20 s a "
        "GB; with a large store stop the host first)",
    )


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    settings = load_settings(args.config, environ)
    if args.vacuum and settings.store.postgres_dsn is not None:
        # VACUUM FULL would lock the tables of a serving database; plain VACUUM is autovacuum's.
        raise SettingsError(
            "--vacuum shrinks the SQLite run store; on PostgreSQL the pruned rows' space is "
            "reused after (auto)vacuum"
        )
    try:
        # Inside the `try`: a configuration naming no store (`"store": {}`) is one line, as
        # in `usage`; it was a traceback (probe O, session 40).
        if settings.store.postgres_dsn is None and not sqlite_runs_path(settings).exists():
            # Nothing to prune, and nothing created (as `usage`).
            raise SettingsError(
                f"no run records: {sqlite_runs_path(settings)} does not exist (a host creates "
                "it when it starts with a provider configured)."
            )
        store = build_run_store(settings, environ, migrate=False)
        try:
            if args.vacuum:
                assert isinstance(store, SqliteRunStore)  # refused above for PostgreSQL
                runs, used = store.prune(args.before, usage=args.usage, vacuum=True)
            else:
                runs, used = store.prune(args.before, usage=args.usage)
        finally:
            store.close()
    except RetrievalError as error:
        raise SettingsError(f"cannot prune the run records: {error}") from None
    said = f"{runs} run record(s)"
    if args.usage:
        said += f" and {used} usage record(s)"
    out.write(f"deleted {said} from before {args.before}\n")
    if args.vacuum:
        path = sqlite_runs_path(settings)
        out.write(f"{path} is now {path.stat().st_size:,} bytes\n")
        log = path.with_name(path.name + "-wal")
        left = log.stat().st_size if log.exists() else 0
        if left:  # the serving host was reading throughout: its own checkpoint finishes it
            out.write(
                f"  its write-ahead log still holds {left:,} bytes: the file shrinks at the "
                "host's next checkpoint\n"
            )
    return 0

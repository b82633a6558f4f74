"""`retrieval-host usage`: the operator's view of the usage records (`core.usage`).

retrieval-host usage --config host.json [--since TIME] [--subject S] [--records] [--json]

Reads the run store the configuration names (the records' default sink) without loading a
model or opening the vector store, so it runs beside a serving host. By default it prints the
records summed per subject, corpus, operation, kind, provider instance, account and model;
`--records` prints each record, `--json` one JSON object per line.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from retrieval_host.adapters.wiring import build_run_store, sqlite_runs_path
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.usage import UsageRecord, summarize
from retrieval_host.serving._args import whole_number
from retrieval_host.settings import SettingsError, load_settings

# The largest integer SQLite and PostgreSQL (bigint) bind.
SQL_INTEGER_MAX = 2**63 - 1
_HEADER = (
    "subject",
    "corpus",
    "operation",
    "kind",
    "provider",
    "account",
    "model",
    "requests",
    "input_tokens",
    "output_tokens",
    "documents",
)


def add_command(commands: Any) -> None:
    usage = commands.add_parser("usage", help="what each subject spent on which models")
    usage.add_argument("--config", required=True, type=Path, help="host configuration JSON")
    usage.add_argument(
        "--since",
        type=instant,
        help="only records at or after this time: RFC 3339 (2026-12-01T00:00:00Z, an offset "
        "such as +02:00 is converted to UTC) or a date (2026-12-01, midnight UTC)",
    )
    usage.add_argument("--subject", help="only this subject's records")
    usage.add_argument("--records", action="store_true", help="each record, not the sums")
    usage.add_argument("--json", action="store_true", help="one JSON object per line")
    usage.add_argument(
        "--limit",
        # SQLite's largest integer: a larger --limit was an OverflowError binding it (probe O,
        # session 40).
        type=whole_number(1, SQL_INTEGER_MAX, f"a whole number from 1 to {SQL_INTEGER_MAX}"),
        default=100_000,
        help="records read at most (1 or more)",
    )


def instant(text: str) -> str:
    """`--since` as the records write their time (`2026-12-01T00:00:00.000Z`, UTC): records
    are compared as that text, so the argument is converted, never compared as written (an
    offset, `Z` without seconds, lower case). A time without an offset is refused: it could be
    any zone."""
    value = text.strip()
    try:
        if len(value) == 10:  # a date alone: midnight UTC
            when = dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
        else:
            when = dt.datetime.fromisoformat(value.upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an RFC 3339 time (2026-12-01T00:00:00Z) or a date (2026-12-01)"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no offset: add Z for UTC (2026-12-01T00:00:00Z) or +HH:MM"
        )
    try:
        utc = when.astimezone(dt.UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+01:00 is in the year 0 in UTC: a traceback (probe O, session 40).
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time of the years 0001-9999 in UTC"
        ) from None
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    settings = load_settings(args.config, environ)
    try:
        if settings.store.postgres_dsn is None and not sqlite_runs_path(settings).exists():
            # A report creates nothing: a mistyped store path made an empty database and
            # read as "nothing was spent" (a black-box test).
            raise SettingsError(
                f"no usage records: {sqlite_runs_path(settings)} does not exist (a host "
                "creates it when it starts with a provider configured)."
            )
        store = build_run_store(settings, environ, migrate=False)
        try:
            records = store.read_usage(since=args.since, subject=args.subject, limit=args.limit)
        finally:
            store.close()
    except RetrievalError as error:
        raise SettingsError(f"cannot read the usage records: {error}") from None
    if args.records:
        rows = [dataclasses.asdict(r) for r in records]
    else:
        rows = [_summary_row(total) for _, total in summarize(records)]
    if args.json:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
        return 0
    columns = list(rows[0]) if rows else list(_HEADER)
    _table(out, columns, [[_cell(row.get(c)) for c in columns] for row in rows])
    return 0


def _summary_row(total: UsageRecord) -> dict[str, object]:
    row = dataclasses.asdict(total)
    return {name: row[name] for name in _HEADER} | {"last": total.at}


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(out: TextIO, columns: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    for line in [columns, *rows]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")

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
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from retrieval_host.adapters.wiring import build_run_store
from retrieval_host.core.usage import UsageRecord, summarize
from retrieval_host.settings import load_settings

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
    usage.add_argument("--since", help="only records at or after this RFC 3339 time (UTC)")
    usage.add_argument("--subject", help="only this subject's records")
    usage.add_argument("--records", action="store_true", help="each record, not the sums")
    usage.add_argument("--json", action="store_true", help="one JSON object per line")
    usage.add_argument("--limit", type=int, default=100_000, help="records read at most")


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    settings = load_settings(args.config, environ)
    store = build_run_store(settings, environ)
    try:
        records = store.read_usage(since=args.since, subject=args.subject, limit=args.limit)
    finally:
        store.close()
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

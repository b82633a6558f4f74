"""`retrieval-host ingest PATH...`: index files into a corpus, resumably, showing progress.

Before anything is indexed: a path that does not exist is an error ("no such file", exit 2),
and files the host cannot ingest are set aside with their reason (an unsupported type, a file
larger than `limits.maxBytes`). On a terminal, a progress bar (rich) follows the files and the
passages of the current one (parsed, then embedded); otherwise one line per file is printed as
it finishes. Either way each finished file gets a status line, the set-aside files are listed
with their reasons, and a last line counts everything. The journal is locked for the run
(`batch.JournalInUseError`): a second run on it is refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from retrieval_host.batch import BatchItem, JournalInUseError, ingest_paths
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import JSONValue
from retrieval_host.ingest import media_type_for_path
from retrieval_host.serving.factory import build_driver, close_driver
from retrieval_host.settings import SettingsError, load_settings


@dataclass(frozen=True)
class FilePlan:
    """What the paths name: files to ingest, files set aside (path, reason), paths that do
    not exist, and the root source ids are relative to (the directory, when one is given)."""

    files: list[Path]
    set_aside: list[tuple[Path, str]]
    missing: list[Path]
    root: Path | None


def plan_files(paths: Sequence[Path]) -> FilePlan:
    """Directories are searched recursively; every file gets a place in the plan."""
    files: list[Path] = []
    set_aside: list[tuple[Path, str]] = []
    missing: list[Path] = []
    for path in paths:
        if not path.exists():
            missing.append(path)
            continue
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for candidate in candidates:
            try:
                media_type_for_path(candidate)
            except RetrievalError:
                suffix = candidate.suffix or "no suffix"
                set_aside.append((candidate, f"unsupported type ({suffix})"))
                continue
            files.append(candidate)
    root = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    return FilePlan(files, set_aside, missing, root)


def too_large(files: Sequence[Path], max_bytes: int) -> list[tuple[Path, str]]:
    """The files over the host's upload limit, with the reason."""
    found = []
    for path in files:
        size = path.stat().st_size
        if size > max_bytes:
            found.append((path, f"too large ({size} bytes; the limit is {max_bytes})"))
    return found


def item_line(item: BatchItem) -> str:
    detail = f"{item.chunk_count} passages" if item.chunk_count is not None else ""
    if item.status == "skipped":
        detail = "done in an earlier run (journal)"
    if item.error_code is not None:
        detail = f"{item.error_code} {item.reason or ''}".strip()
    return f"{item.status:<9} {item.source_id}  {detail}".rstrip()


class _Lines:
    """No terminal: one line per file as it finishes."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def passages(self, phase: str, done: int, total: int | None) -> None:
        pass

    def finished(self, item: BatchItem) -> None:
        print(item_line(item), file=self._out, flush=True)


class _Bars:
    """A terminal: the files and the passages of the current file, as rich progress bars."""

    def __init__(self, progress: Progress, files: int) -> None:
        self._progress = progress
        self._files = progress.add_task("files", total=files)
        self._passages: TaskID = progress.add_task("passages", total=None, visible=False)

    def passages(self, phase: str, done: int, total: int | None) -> None:
        label = {"parse": "parsing", "embed": "embedding"}.get(phase, phase)
        self._progress.update(
            self._passages, description=label, completed=done, total=total, visible=True
        )

    def finished(self, item: BatchItem) -> None:
        self._progress.console.print(item_line(item), highlight=False, markup=False)
        self._progress.update(self._passages, visible=False)
        self._progress.advance(self._files)


@contextmanager
def _display(files: int, out: TextIO, err: TextIO) -> Iterator[_Lines | _Bars]:
    if not err.isatty():
        yield _Lines(out)
        return
    columns = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(file=err), transient=True) as progress:
        yield _Bars(progress, files)


def _list_set_aside(set_aside: Sequence[tuple[Path, str]], out: TextIO) -> None:
    for path, reason in set_aside:
        print(f"{'skipped':<9} {path}  {reason}", file=out)


_PHASES = {"ingest.parse": "parse", "index.embedding": "embed", "index.commit": "commit"}


def run_ingest(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    idle_ms: int | None = getattr(args, "idle_timeout_ms", None)
    if idle_ms is not None and idle_ms < 1:
        print("retrieval-host: --idle-timeout-ms must be a positive number", file=err)
        return 2
    plan = plan_files(args.paths)
    if plan.missing:
        for path in plan.missing:
            print(f"retrieval-host: no such file: {path}", file=err)
        return 2
    settings = load_settings(args.config, environ)
    if not plan.files:
        _list_set_aside(plan.set_aside, out)
        print("retrieval-host: no PDF, Markdown, text, HTML or e-mail file to ingest", file=err)
        return 2
    journal = args.journal or Path(f".retrieval-host-ingest-{args.corpus}.jsonl")
    driver = build_driver(settings, environ)
    if driver is None:
        raise SettingsError("ingest needs an application (the factory that builds the corpora)")
    set_aside = plan.set_aside + too_large(plan.files, driver.ingest_limits.max_bytes)
    excluded = {path for path, _ in set_aside}
    files = [path for path in plan.files if path not in excluded]
    try:
        with _display(len(files), out, err) as display:

            def on_progress(phase: str, details: Mapping[str, JSONValue]) -> None:
                name = _PHASES.get(phase)
                done, total = details.get("done"), details.get("total")
                if name is not None and isinstance(total, int | None):
                    count = done if isinstance(done, int) else (total or 0)
                    display.passages(name, count, total)

            report = ingest_paths(
                driver,
                args.corpus,
                files,
                RequestContext(subject=args.subject, on_progress=on_progress),
                journal_path=journal,
                on_item=display.finished,
                root=plan.root,
                deadline_s=settings.limits.ingest_deadline_s,
                idle_timeout_s=None if idle_ms is None else idle_ms / 1000,
            )
    except JournalInUseError as exc:
        print(f"retrieval-host: {exc}", file=err)
        return 2
    finally:
        close_driver(driver)
    _list_set_aside(set_aside, out)
    counts = ", ".join(
        f"{report.count(status) + (len(set_aside) if status == 'skipped' else 0)} {status}"
        for status in ("indexed", "unchanged", "skipped", "failed")
    )
    print(f"{counts} (journal: {journal})", file=out)
    return 1 if report.count("failed") or report.cancelled else 0

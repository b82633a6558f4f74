"""`retrieval-host ingest PATH...`: index files into a corpus, resumably, showing progress.

Before anything is indexed: a path that does not exist is an error ("no such file", exit 2),
and files the host cannot ingest are set aside with their reason (an unsupported type, a file
larger than `limits.maxBytes`, a link inside a folder: links there are not followed). A file
named twice is taken once. Mistakes are one `retrieval-host: ...` line and exit 2, before any
file is ingested: two files with one source id, a journal whose folder does not exist or that
another run holds (`batch.JournalInUseError`), a corpus the host does not have, a subject that
may not index into it. On a terminal, a progress bar (rich) follows the files and the
passages of the current one (parsed, then embedded); otherwise one line per file is printed as
it finishes. Either way each finished file gets a status line, the set-aside files are listed
with their reasons, and a last line counts everything.

Ctrl-C (SIGINT), SIGTERM or SIGHUP cancels the batch: no further file starts, the files in flight
stop at their next cancel check before their commit, and the command says so, prints its
counts and exits 130 (resume with the same journal). A second Ctrl-C quits at once.

Exit codes: 0 every file done, 1 some file failed, 2 the command could not run or stopped (its
line on stderr), 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO
from urllib.parse import quote

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from retrieval_host.adapters.wiring import without_migration
from retrieval_host.batch import (
    IN_FLIGHT,
    NOT_STARTED,
    BatchItem,
    BatchReport,
    JournalError,
    ListedFile,
    ingest_paths,
    source_id_for,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONValue
from retrieval_host.ingest import media_type_for_path
from retrieval_host.serving.factory import build_driver, close_driver
from retrieval_host.settings import (
    HostSettings,
    OpenAIProviderSettings,
    SettingsError,
    load_settings,
)


@dataclass(frozen=True)
class FilePlan:
    """What the paths name: files to ingest, files set aside (path, reason), paths that do
    not exist, the root source ids are relative to (the directory, when one is given), and
    which file each file to ingest was when listed (the batch reads that one or none)."""

    files: list[Path]
    set_aside: list[tuple[Path, str]]
    missing: list[Path]
    root: Path | None
    listed: dict[Path, ListedFile]


def plan_files(paths: Sequence[Path]) -> FilePlan:
    """Directories are searched recursively; every file gets a place in the plan.

    In a directory, links are not followed: a link to a file outside it would bring in a file
    the folder does not hold, and one to a file inside it would index that file twice (under
    two source ids). Each is set aside with what it points at. A path named on the command
    line is taken as given, link or not. A file reached twice (named twice, or named and in a
    folder named too) is planned once. Links are checked here, but a writer of the folder can
    swap a file for one later: the batch reads only the file listed (`ListedFile`)."""
    files: list[Path] = []
    listed: dict[Path, ListedFile] = {}
    set_aside: list[tuple[Path, str]] = []
    missing: list[Path] = []
    given: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            missing.append(path)
        else:
            given.setdefault(path.resolve(), path)
    seen: set[Path] = set()
    for path in given.values():
        candidates, links = _walk(path) if path.is_dir() else (_named(path), [])
        set_aside.extend(links)
        for candidate, identity in candidates:
            resolved = candidate.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            try:
                media_type_for_path(candidate)
            except RetrievalError:
                suffix = candidate.suffix or "no suffix"
                set_aside.append((candidate, f"unsupported type ({suffix})"))
                continue
            files.append(candidate)
            listed[candidate] = identity
    unique = list(given.values())
    root = unique[0] if len(unique) == 1 and unique[0].is_dir() and not missing else None
    return FilePlan(files, set_aside, missing, root, listed)


def _named(path: Path) -> list[tuple[Path, ListedFile]]:
    """A path named on the command line: the file it names now, link or not."""
    status = path.stat()
    return [(path, ListedFile(status.st_dev, status.st_ino))]


def _walk(folder: Path) -> tuple[list[tuple[Path, ListedFile]], list[tuple[Path, str]]]:
    """The regular files under `folder`, in path order, and its links with their reasons."""
    files: list[tuple[Path, ListedFile]] = []
    links: list[tuple[Path, str]] = []
    top = folder.resolve()
    # followlinks=False: a link to a folder is listed among the folders, not entered.
    for directory, folders, names in os.walk(folder):
        here = Path(directory)
        for name in (*folders, *names):
            entry = here / name
            try:
                status = entry.lstat()  # one look: the type and the file it is (device, inode)
            except OSError:
                continue  # gone since the folder was read
            if stat.S_ISLNK(status.st_mode):
                links.append((entry, _link_reason(entry, top)))
            elif name in names and stat.S_ISREG(status.st_mode):  # not a FIFO, socket, device
                files.append((entry, ListedFile(status.st_dev, status.st_ino, folder)))
    return sorted(files, key=lambda found: found[0]), sorted(links)


def _link_reason(link: Path, top: Path) -> str:
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        return "a broken link"
    kind = "folder" if target.is_dir() else "file"
    if not target.is_relative_to(top):
        return f"a link to a {kind} outside the folder"
    inside = target.relative_to(top).as_posix()
    return f"a link to {inside} in the folder (links are not followed)"


def _duplicate_ids(files: Sequence[Path], root: Path | None) -> str | None:
    """Why the files cannot each have their own source id, or None."""
    seen: dict[str, Path] = {}
    for path in files:
        source_id = source_id_for(path, root)
        if source_id in seen:
            return (
                f"{seen[source_id]} and {path} would both be source id {source_id!r}: with "
                "several paths a file's source id is its name; give the one folder that holds "
                "both (source ids are then paths under it), or ingest them in separate runs."
            )
        seen[source_id] = path
    return None


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
        # With a reason, the file is not the one listed any more (swapped for a link, a FIFO).
        detail = item.reason or "done in an earlier run (journal)"
    elif item.status == "cancelled":
        detail = "stopped before its commit" if item.reason == IN_FLIGHT else "not started"
    if item.error_code is not None:
        detail = f"{item.error_code} {item.reason or ''}".strip()
        if item.detail and item.detail != item.reason:
            detail = f"{detail}: {item.detail}"
    return f"{item.status:<9} {item.source_id}  {detail}".rstrip()


class _Lines:
    """No terminal: one line per file as it finishes."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self._out = out
        self._err = err

    def note(self, message: str) -> None:
        print(message, file=self._err, flush=True)

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

    def note(self, message: str) -> None:
        self._progress.console.print(message, highlight=False, markup=False)

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
        yield _Lines(out, err)
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


INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _interrupt_cancels(
    cancel: CancelToken, note: Callable[[str], None], out: TextIO, err: TextIO
) -> Iterator[None]:
    """While the batch runs, Ctrl-C (SIGINT) cancels it instead of raising KeyboardInterrupt:
    raised in the waiting thread, that would leave the thread pool, which waits for the files
    in flight to finish and commit (9-20 s, silently). A second Ctrl-C quits at once: every
    journal line and every commit is atomic, so a rerun of the journal resumes as usual.
    SIGTERM (a service manager, `timeout`, `kill`) and SIGHUP (the terminal closed) do the
    same: by default they ended the command at once, without a word or its counts."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; an embedding caller keeps its own
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        # Writes may fail: after SIGHUP the terminal is gone (EIO), and an exception raised
        # in a handler would surface anywhere in the main thread instead of the counts.
        if cancel.cancelled:
            if signum != signal.SIGINT:
                # A closing terminal often sends SIGHUP twice: only Ctrl-C escalates.
                with contextlib.suppress(OSError):
                    note("retrieval-host: still cancelling (Ctrl-C quits at once)")
                return
            with contextlib.suppress(OSError):
                out.flush()
                err.write("\nretrieval-host: interrupted again: quitting at once\n")
                err.flush()
            os._exit(130)
        cancel.cancel()
        with contextlib.suppress(OSError):
            note(
                "retrieval-host: cancelling: no further file starts and the files in flight "
                "stop before their commit (Ctrl-C again quits at once)"
            )

    previous = {sig: signal.signal(sig, on_sigint) for sig in INTERRUPTS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _without_provider_keys(settings: HostSettings) -> HostSettings:
    """The settings with no generation provider's API key: a batch ingest makes no run, and
    the operator or job running it should not need the production model's secret (it was
    refused with "environment variable ... is not set", a black-box test). The providers
    stay (the run store, where ingests record their usage, comes with them)."""
    providers = {
        name: config.model_copy(update={"api_key": None})
        if isinstance(config, OpenAIProviderSettings)
        else config
        for name, config in settings.providers.items()
    }
    return settings.model_copy(update={"providers": providers})


def _stopped(exc: RetrievalError, args: argparse.Namespace, journal: Path) -> str:
    if exc.code is ErrorCode.PERMISSION_DENIED:
        return f"subject {args.subject!r} may not index into corpus {args.corpus!r} ({exc})"
    if exc.code is ErrorCode.INVALID_REQUEST:
        # Raised only by the plan, before any file (a file's own request error is its item):
        # a rerun would meet the same paths.
        return f"nothing was ingested: {exc}"
    if exc.code is ErrorCode.STORE_READ_ONLY:
        # No rerun against this configuration can write (probe R): name what would.
        return f"nothing was ingested: {exc} (point --config at the writable store)"
    return f"the batch stopped: {exc} (rerun with the journal {journal} to resume)"


def _summary(report: BatchReport, set_aside: int, journal: Path) -> str:
    counts = [
        f"{report.count(status) + (set_aside if status == 'skipped' else 0)} {status}"
        for status in ("indexed", "unchanged", "skipped", "failed")
    ]
    if report.cancelled:
        counts.append(f"{report.count('cancelled')} cancelled")
    return f"{', '.join(counts)} (journal: {journal})"


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
    # A corpus id may hold `/` (and `..`): quoted, the default stays one file here (it named
    # a folder that did not exist, a black-box test).
    default = f".retrieval-host-ingest-{quote(args.corpus, safe='')}.jsonl"
    journal = args.journal or Path(default)
    if not journal.parent.is_dir():
        print(f"retrieval-host: the journal's folder {journal.parent} does not exist", file=err)
        return 2
    clash = _duplicate_ids(plan.files, plan.root)
    if clash is not None:
        print(f"retrieval-host: {clash}", file=err)
        return 2
    # The host migrates its stores at its start; this command refuses ones of an earlier
    # release (they would no longer open under the host still serving them).
    with without_migration():
        driver = build_driver(_without_provider_keys(settings), environ)
    if driver is None:
        raise SettingsError("ingest needs an application (the factory that builds the corpora)")
    try:
        corpora = driver.retrieval.corpora
        if args.corpus not in corpora:
            print(
                f"retrieval-host: this host has no corpus {args.corpus!r} "
                f"(its corpora: {', '.join(sorted(corpora)) or 'none'})",
                file=err,
            )
            return 2
        set_aside = plan.set_aside + too_large(plan.files, driver.ingest_limits.max_bytes)
        excluded = {path for path, _ in set_aside}
        files = [path for path in plan.files if path not in excluded]
        cancel = CancelToken()
        with _display(len(files), out, err) as display:

            def on_progress(phase: str, details: Mapping[str, JSONValue]) -> None:
                name = _PHASES.get(phase)
                done, total = details.get("done"), details.get("total")
                if name is not None and isinstance(total, int | None):
                    count = done if isinstance(done, int) else (total or 0)
                    display.passages(name, count, total)

            with _interrupt_cancels(cancel, display.note, out, err):
                report = ingest_paths(
                    driver,
                    args.corpus,
                    files,
                    RequestContext(subject=args.subject, cancel=cancel, on_progress=on_progress),
                    journal_path=journal,
                    on_item=display.finished,
                    root=plan.root,
                    deadline_s=settings.limits.ingest_deadline_s,
                    idle_timeout_s=None if idle_ms is None else idle_ms / 1000,
                    listed=plan.listed,
                )
    except JournalError as exc:
        print(f"retrieval-host: {exc}", file=err)
        return 2
    except RetrievalError as exc:
        print(f"retrieval-host: {_stopped(exc, args, journal)}", file=err)
        return 2
    finally:
        close_driver(driver)
    _list_set_aside(set_aside, out)
    print(_summary(report, len(set_aside), journal), file=out)
    if report.cancelled:
        stopped = sum(1 for item in report.items if item.reason == IN_FLIGHT)
        unstarted = sum(1 for item in report.items if item.reason == NOT_STARTED)
        print(
            f"retrieval-host: cancelled: {stopped} files stopped before their commit, "
            f"{unstarted} not started; rerun with the journal {journal} to resume",
            file=err,
        )
        return 130
    return 1 if report.count("failed") else 0

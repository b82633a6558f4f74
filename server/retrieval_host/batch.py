"""Batch ingestion of many files, several in flight, resumable after a crash, stoppable.

A caller of the Driver (like the CLI and the HTTP layer), so it sits above it, not in
`ingest/`: the ingest helpers below the Driver never import it.

Each file is one source, ingested with `Driver.ingest_context`, so each lands atomically: the
index only ever holds complete revisions. There is no staging area anywhere: a file's passages
exist only inside the store's replacement transaction until it commits. So a batch that is
cancelled (or killed) leaves exactly the files that had committed, nothing half-written.
`in_flight` files (default `DEFAULT_IN_FLIGHT`) are ingested at once, each on a thread of its
own, so that the embedding lanes always have work while other files parse or commit; they
finish, commit and are journaled in whatever order they get there.

The journal is a JSON-lines file, one line per finished file (`indexed`, `unchanged` or
`failed`), each written and fsync'ed as the file finishes. A rerun reads it and skips
files recorded as `indexed` or `unchanged` for the same corpus, source id and file content
(SHA-256 of the bytes) that the store still holds at the journaled revision (in the namespace
the batch's subject indexes into); everything else is ingested again. The journal says what a
run did, not what this store holds: reused against another store (a new database, a restored
backup, a corpus rebuilt for a new analyzer) its files are ingested, not skipped. A file
interrupted mid-way was either not committed (it is indexed now) or committed without its
journal line (the rerun gets `unchanged`, without embedding): revisions are content digests
and replacement is atomic, so nothing is ever duplicated. A torn last journal line (a crash
during the write) is ignored. One journal belongs to one batch at a time: a run holds an
exclusive lock on it (`flock`) from before it reads the journal until it ends, and a second
run on the same journal is refused with `JournalInUseError` before it does anything. The lock
goes with the process.

Source ids: the path relative to `root` with `/` separators when `root` is given (keeps ids
unique across directories), else the file name. A file named twice is ingested once; two
different files mapping to one id, or a file outside `root`, are refused before anything is
ingested.

Each file is read from one descriptor opened without blocking: a regular file, the one listed
(`ListedFile`: below its folder, through no link), else `skipped` with the reason (probe S: a
listed file swapped for a link indexed a file outside the folder; for a FIFO, hung the batch).

A cancel (the caller's token, or a `KeyboardInterrupt` reaching the waiting thread) starts no
further file and cancels the token of every file in flight, so each stops at its next cancel
check (the parse worker is killed, embedding stops between slices) and none commits after it,
unless it was already committing. The report then lists those files `cancelled`
(`reason="in-flight"`), and the files never started `cancelled` (`reason="not-started"`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Final, Literal

from retrieval_host.core.cancel import LinkedCancel
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.grants import authorize_or_none
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.core.validation import check_id
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.ingest.settings import media_type_for_path, too_large
from retrieval_host.memory import trim_heap

JOURNAL_VERSION: Final = 1
# Files in flight at once. Each file's parsing (in a parse worker process), token counting,
# embedding and commit follow one another; with several files in flight the embedding lanes
# (one per core, shared by every call) always have a next batch, while other files parse or
# commit. Four keep two lanes busy (`bench/ingest.py`); more only hold more parsed passages.
DEFAULT_IN_FLIGHT: Final = 4

# Failures that belong to one file: recorded, and the batch goes on with the next file.
# Anything else (store down, embedding failing, no permission at all) stops the batch.
_PER_FILE: Final = frozenset(
    {
        ErrorCode.INVALID_DOCUMENT,
        ErrorCode.DOCUMENT_TOO_COMPLEX,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        ErrorCode.CAPACITY_EXCEEDED,
        ErrorCode.SOURCE_CONFLICT,
        ErrorCode.CHUNK_ID_CONFLICT,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.SOURCE_UNAVAILABLE,
        ErrorCode.TIMEOUT,  # the file's own inactivity timeout (`idle_timeout_s`)
    }
)


Status = Literal["indexed", "unchanged", "skipped", "failed", "cancelled"]
# The reasons of `cancelled` items: stopped before its commit, or never started.
IN_FLIGHT: Final = "in-flight"
NOT_STARTED: Final = "not-started"


class JournalError(Exception):
    """The journal cannot be used: its folder is missing, it cannot be opened or written (a
    full disk), or another run holds it (`JournalInUseError`)."""


class JournalInUseError(JournalError):
    """Another batch holds the journal: two runs on one journal would repeat each other's work
    and interleave their lines."""


@dataclass(frozen=True)
class BatchItem:
    """What happened to one file. `skipped` means the journal already recorded it done (or,
    with a `reason`, that the path no longer names the regular file listed, `ListedFile`);
    `cancelled` that the batch was cancelled before the file committed (`reason`: `in-flight`,
    stopped before its commit, or `not-started`); a rerun ingests it."""

    path: str
    source_id: str
    status: Status
    revision: str | None = None
    chunk_count: int | None = None
    error_code: str | None = None
    reason: str | None = None
    detail: str | None = None  # a failure's own words ("... more than 2000 pages.")


@dataclass(frozen=True)
class BatchReport:
    """The outcome of `ingest_paths`, one item per file in file order; `cancelled` if it
    stopped early (its unfinished files are then items with the status `cancelled`)."""

    items: tuple[BatchItem, ...]
    cancelled: bool

    def count(self, status: Status) -> int:
        return sum(1 for item in self.items if item.status == status)


@dataclass(frozen=True)
class ListedFile:
    """Which file a path named when the caller listed it (`st_dev`, `st_ino`), and the folder
    it was found in, below which no link is followed (None: a path named as is, taken as given)."""

    device: int
    inode: int
    folder: Path | None = None


def source_id_for(path: Path, root: Path | None) -> str:
    """The source id of a file: its path under `root` (POSIX separators), else its name.

    The path under `root` as written when it is one (a file found by walking `root`, or a link
    in it, keeps the name it has there), else after resolving both; a file that is under
    `root` neither way is refused (`INVALID_REQUEST` / `outside-root`)."""
    if root is None:
        return path.name
    try:
        relative = path.relative_to(root)
    except ValueError:
        pass
    else:
        if ".." not in relative.parts:
            return relative.as_posix()
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"{path} is not under the root {root}, so it has no source id there.",
            reason=InvalidRequestReason.OUTSIDE_ROOT,
        ) from None


def ingest_paths(
    driver: Driver,
    corpus: str,
    paths: Sequence[Path],
    context: RequestContext,
    *,
    journal_path: Path,
    progress: Callable[[int, int], None] | None = None,
    on_item: Callable[[BatchItem], None] | None = None,
    root: Path | None = None,
    deadline_s: float | None = None,
    idle_timeout_s: float | None = None,
    in_flight: int | None = None,
    listed: Mapping[Path, ListedFile] | None = None,
) -> BatchReport:
    """Ingest `paths` into `corpus`, `in_flight` files at a time (see the module docstring).

    `deadline_s` bounds each file's parsing and embedding (the host configuration's
    `limits.ingestDeadlineS`; None: the driver's own `ingest_deadline_s`); a file past it is
    recorded `failed` with `DOCUMENT_TOO_COMPLEX` / `deadline` and the batch goes on.
    `idle_timeout_s` ends a file that makes no progress (parse, an embedding slice, the
    commit) for that long: it is recorded `failed` with `TIMEOUT` / `idle-timeout`, keeps its
    previous revision, and the batch goes on with the next file and a fresh clock.
    `progress(done, total)` and `on_item(item)` are called on the caller's thread after each
    file, in the order files finish; the ingest of a file reports its phases to
    `context.on_progress` from the thread ingesting it (`Driver.ingest_context`); a file
    stopped by a cancel is reported to both too, with the status `cancelled`. Raises
    `JournalInUseError` when another run holds the journal, `JournalError` when it cannot be
    opened (a missing folder), and `INVALID_REQUEST` (`duplicate-source-id`, `outside-root`)
    before anything is ingested when the paths cannot have one source id each. A cancel of
    `context` starts no further file, aborts the files in flight before they commit, and
    returns the report with `cancelled=True`; a `KeyboardInterrupt` in the calling thread
    aborts them the same way and is raised once they have stopped. Errors that are not about
    one file stop the batch the same way and are raised. `listed`: which file each path named
    when the caller listed it (a path not in it is taken as given: see the module docstring).
    """
    planned = _plan(paths, root)
    with _Journal(journal_path) as journal:
        done = _read_journal(journal_path, corpus)
        batch = LinkedCancel(context.cancel)

        def one(path: Path, source_id: str) -> BatchItem:
            token = LinkedCancel(batch, idle_timeout_s)
            scoped = replace(context, cancel=token)
            known = listed.get(path) if listed else None
            return _one(driver, corpus, path, source_id, known, scoped, done, journal, deadline_s)

        finished: dict[int, BatchItem] = {}
        failure: BaseException | None = None
        cancelled = False
        width = max(1, in_flight if in_flight is not None else DEFAULT_IN_FLIGHT)
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix="ingest-file") as pool:
            running: dict[Future[BatchItem], int] = {}
            queued = iter(enumerate(planned))
            try:
                while True:
                    while len(running) < width and failure is None and not cancelled:
                        if context.cancel.cancelled:
                            cancelled = True
                            break
                        step = next(queued, None)
                        if step is None:
                            break
                        index, (path, source_id) = step
                        running[pool.submit(one, path, source_id)] = index
                    if not running:
                        break
                    ended, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in sorted(ended, key=running.__getitem__):
                        index = running.pop(future)
                        try:
                            item = future.result()
                        except RetrievalError as exc:
                            batch.cancel()  # the files still in flight stop before their commit
                            if exc.code == ErrorCode.CANCELLED and context.cancel.cancelled:
                                cancelled = True
                                path, source_id = planned[index]
                                item = BatchItem(
                                    str(path), source_id, "cancelled", reason=IN_FLIGHT
                                )
                            else:
                                failure = failure or exc
                                continue
                        except BaseException as exc:
                            failure = failure or exc
                            batch.cancel()
                            continue
                        finished[index] = item
                        if progress is not None:
                            progress(len(finished), len(planned))
                        if on_item is not None:
                            on_item(item)
            except BaseException:
                # A KeyboardInterrupt (or a failing callback) in this thread: leaving the pool
                # waits for the files in flight, so stop them first (before their commit).
                batch.cancel()
                raise
        if failure is not None:
            raise failure
    # The batch's parsing, commits and index updates left freed memory in the C heap: give it
    # back to the system, so the host's RSS after a batch is what it holds (a 5,323-passage
    # ingest: ~10-16 MiB of 400).
    trim_heap()
    items = tuple(
        finished.get(index) or BatchItem(str(path), source_id, "cancelled", reason=NOT_STARTED)
        for index, (path, source_id) in enumerate(planned)
    )
    return BatchReport(items, cancelled=cancelled)


def _plan(paths: Sequence[Path], root: Path | None) -> list[tuple[Path, str]]:
    """(path, source id) per file, a file named twice (the same file, once resolved) once;
    two different files with one source id are refused."""
    planned: list[tuple[Path, str]] = []
    seen_files: set[Path] = set()
    seen_ids: dict[str, Path] = {}
    for path in paths:
        resolved = path.resolve()
        if resolved in seen_files:
            continue
        seen_files.add(resolved)
        source_id = source_id_for(path, root)
        try:
            check_id("source id", source_id)
        except RetrievalError as exc:
            # Which file: a name that is not UTF-8 stopped the batch as "could not be
            # parsed", and the journal's resume met it again (a black-box test).
            raise RetrievalError(
                exc.code, f"{str(path)!r} has no usable source id: {exc.detail}", reason=exc.reason
            ) from None
        if source_id in seen_ids:
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"two files map to source id {source_id!r} ({seen_ids[source_id]} and {path}); "
                "pass a `root` above both, so that source ids are paths under it.",
                reason="duplicate-source-id",
            )
        seen_ids[source_id] = path
        planned.append((path, source_id))
    return planned


def _one(
    driver: Driver,
    corpus: str,
    path: Path,
    source_id: str,
    listed: ListedFile | None,
    context: RequestContext,
    done: dict[tuple[str, str], str],
    journal: _Journal,
    deadline_s: float | None,
) -> BatchItem:
    name = str(path)
    try:
        media_type = media_type_for_path(path)
        data = _read(path, listed, driver.ingest_limits.max_bytes)
    except _NotListed as exc:
        return BatchItem(name, source_id, "skipped", reason=str(exc))
    except RetrievalError as exc:
        return _failed(journal, corpus, name, source_id, None, exc)
    except OSError:
        unreadable = RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "the file could not be read.",
            reason=InvalidRequestReason.UNREADABLE,
        )
        return _failed(journal, corpus, name, source_id, None, unreadable)
    file_sha256 = hashlib.sha256(data).hexdigest()
    journaled = done.get((source_id, file_sha256))
    if journaled is not None and _holds(driver, corpus, source_id, journaled, context):
        return BatchItem(name, source_id, "skipped")
    try:
        result = driver.ingest_context(
            IngestRequest(corpus, source_id, media_type, data), context, deadline_s=deadline_s
        )
    except RetrievalError as exc:
        if exc.code not in _PER_FILE:
            raise
        return _failed(journal, corpus, name, source_id, file_sha256, exc)
    journal.append(
        {
            "v": JOURNAL_VERSION,
            "corpus": corpus,
            "sourceId": source_id,
            "path": name,
            "fileSha256": file_sha256,
            "status": result.status,
            "revision": result.source.revision,
            "chunkCount": result.chunk_count,
        }
    )
    return BatchItem(name, source_id, result.status, result.source.revision, result.chunk_count)


class _NotListed(Exception):
    """The path no longer names the regular file listed: skipped, with the reason."""


_CHANGED: Final = "changed since it was listed"
# Never blocks: opening a FIFO for reading waits for a writer, in the kernel, past SIGTERM.
_OPEN_FILE: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_FOLDER: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read(path: Path, listed: ListedFile | None, max_bytes: int) -> bytes:
    """The bytes of the file `path` names, read from one descriptor: a regular file, the one
    listed (`_NotListed` else), at most `max_bytes` (`too_large` else); OSError if unreadable."""
    with open(_open(path, listed), "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise _NotListed("not a regular file")
        if listed is not None and (status.st_dev, status.st_ino) != (listed.device, listed.inode):
            raise _NotListed(_CHANGED)
        if status.st_size <= max_bytes:
            data = file.read(max_bytes + 1)  # bounded: the file may grow as it is read
            if len(data) <= max_bytes:
                return data
    raise too_large("bytes", f"the file is larger than {max_bytes}.")


def _open(path: Path, listed: ListedFile | None) -> int:
    """The file's descriptor: a path named as is, as given; else from its folder, via no link."""
    if listed is None or listed.folder is None:
        return os.open(path, _OPEN_FILE)
    *folders, name = path.relative_to(listed.folder).parts
    fd = os.open(listed.folder, _OPEN_FOLDER & ~os.O_NOFOLLOW)  # the folder named: as given
    try:
        for folder in folders:
            below = os.open(folder, _OPEN_FOLDER, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.open(name, _OPEN_FILE | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link now, or a folder above it is
            raise _NotListed(_CHANGED) from None
        raise
    finally:
        os.close(fd)


def _holds(
    driver: Driver, corpus_id: str, source_id: str, revision: str, context: RequestContext
) -> bool:
    """Whether the store holds `source_id` at `revision` now, where the subject indexes it."""
    corpus = driver.retrieval.corpus(corpus_id)
    grant = authorize_or_none(corpus, "index", (source_id,), context)
    if grant is None:
        return False  # the ingest answers the refusal
    stored = corpus.store.get_source(corpus.id, grant.namespace, source_id)
    return stored is not None and stored.revision == revision


def _failed(
    journal: _Journal,
    corpus: str,
    name: str,
    source_id: str,
    file_sha256: str | None,
    error: RetrievalError,
) -> BatchItem:
    # Recorded for the operator; a rerun tries failed files again.
    journal.append(
        {
            "v": JOURNAL_VERSION,
            "corpus": corpus,
            "sourceId": source_id,
            "path": name,
            "fileSha256": file_sha256,
            "status": "failed",
            "errorCode": error.code.value,
            "reason": error.reason,
        }
    )
    return BatchItem(
        name, source_id, "failed", None, None, error.code.value, error.reason, error.detail
    )


def _read_journal(path: Path, corpus: str) -> dict[tuple[str, str], str]:
    """(source id, file SHA-256) -> revision, of files recorded done for `corpus`."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    done: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash mid-write
        if (
            isinstance(entry, dict)
            and entry.get("v") == JOURNAL_VERSION
            and entry.get("corpus") == corpus
            and entry.get("status") in ("indexed", "unchanged")
            and isinstance(entry.get("sourceId"), str)
            and isinstance(entry.get("fileSha256"), str)
            and isinstance(entry.get("revision"), str)
        ):
            done[(entry["sourceId"], entry["fileSha256"])] = entry["revision"]
    return done


class _Journal:
    """Append-only JSON lines, each one durable (fsync) before the call returns."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def __enter__(self) -> _Journal:
        created = not self._path.exists()
        try:
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except FileNotFoundError:
            raise JournalError(
                f"the journal's folder {self._path.parent} does not exist."
            ) from None
        except OSError as exc:
            raise JournalError(
                f"the journal {self._path} cannot be opened: {exc.strerror}."
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise JournalInUseError(
                f"the journal {self._path} is in use by another ingest run."
            ) from None
        if created:
            _fsync_dir(self._path.parent)
        elif self._path.stat().st_size > 0:
            with self._path.open("rb") as existing:
                if not _is_journal(existing):
                    # `--journal state/host.json` appended records to the host's config (a
                    # black-box test): a file that is not a journal is never written to.
                    os.close(self._fd)
                    raise JournalError(
                        f"{self._path} is not a journal (its first line is not a journal "
                        "record): name a new file, or one an earlier ingest run wrote."
                    )
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    # Close a torn line so the next entry starts on a line of its own.
                    os.write(self._fd, b"\n")
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._fd)

    def append(self, entry: dict[str, object]) -> None:
        """Write one line durably; `JournalError` when it cannot be (a full disk): the batch
        stops there, and a rerun finds the file's commit (`unchanged`, no embedding)."""
        line = json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"
        with self._lock:  # files in flight finish on their own threads
            data = line.encode("utf-8")
            try:
                while data:  # a full disk can take part of a line and refuse the rest
                    data = data[os.write(self._fd, data) :]
                os.fsync(self._fd)
            except OSError as exc:
                raise JournalError(
                    f"the journal {self._path} could not be written: {exc.strerror} (the batch "
                    "stopped; rerun with the journal once it can be written to resume)"
                ) from None


def _is_journal(existing: BinaryIO) -> bool:
    """Whether a file's first line is one of a journal's records, or the start of one torn by
    a crash or a full disk during a write: it does not parse, begins as a record does, and is
    the last line, or a later run closed it and what follows is a record or torn alike (black-
    box tests: a journal whose first record was torn resumed once and was then refused, and
    one whose resume was torn too). A one-line JSON file without a line end (`json.dump`
    writes host.json and ACL files so) parses: it is not a journal (a black-box test)."""
    line = existing.readline(64 * 1024)
    if _journal_line(line):
        return True
    if not _torn(line):
        return False
    following = existing.readline(64 * 1024)
    if not following:  # the torn line is the last, closed by a resume or not
        return len(line.removesuffix(b"\n")) > 1  # `{` alone is no record's start
    return _journal_line(following) or _torn(following)


def _journal_line(line: bytes) -> bool:
    try:
        return _record(json.loads(line))
    except ValueError:
        return False


def _torn(line: bytes) -> bool:
    """A line that does not parse and begins as a record's line does."""
    head = line.removesuffix(b"\n")
    if not head or _parses(head):
        return False
    return any(head.startswith(s) or s.startswith(head) for s in _RECORD_STARTS)


def _parses(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _record(entry: object) -> bool:
    return isinstance(entry, dict) and entry.get("v") == JOURNAL_VERSION


# How a record's line begins (its keys are sorted): `chunkCount` first, or `corpus` for one
# that failed.
_RECORD_STARTS: Final = (b'{"chunkCount":', b'{"corpus":')


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

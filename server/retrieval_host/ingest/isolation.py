"""Untrusted documents are parsed in worker processes that the host can kill.

A parser is a large attack surface with unbounded worst cases (pypdf interprets content
streams operator by operator; a 5.6 KB PDF once held it for 40 s; memory freed by a parse is
not always given back to the OS). So the host never parses an uploaded document itself:
`ParsePool.parse` sends the bytes to a worker process and waits for the passages, polling the
request's `CancelToken` every `POLL_S`. When the token is cancelled (the client went away, the
ingest deadline passed, the host is shutting down) the worker is killed with SIGKILL at once and
the caller gets `CANCELLED`, so a disconnect frees the request's concurrency slot within
`POLL_S` plus the kill (well under 1 s), whatever the parser was doing.

Each worker:

- is started with the `forkserver` method: the host is multi-threaded (uvicorn, the request
  threads, onnxruntime), and a `fork` of it could copy a lock some other thread holds;
  `forkserver` forks from a small single-threaded server that imported the parsers once, so a
  replacement worker is ready in tens of milliseconds, not the ~1 s a fresh interpreter
  (`spawn`) needs to import pypdf and BeautifulSoup. The fork server starts with the pool
  (`ParsePool.start`, at host start) and loads everything a worker runs then
  (`ingest.fork_server`): a worker never reads the host's code from disk, so a release
  written into the venv under a running host takes effect at the restart, not in a worker
  that mixes old and new modules (probe I, session 42);
- says it has started before it takes a document. One that dies before that (it could not
  start: the fork server is gone, a fork failed) is the host's failure, answered `HOST_BUSY` /
  `parse-worker-unavailable` (503, retry later) and logged with its cause, never the
  document's `parser-exited`;
- caps its address space (`RLIMIT_AS`) at its size after start-up plus `MEMORY_HEADROOM_BYTES`:
  an allocation beyond it fails (`MemoryError`, answered `DOCUMENT_TOO_COMPLEX` /
  `memory-limit`) instead of growing the machine's memory;
- arms, per task, a CPU-time limit (`RLIMIT_CPU` soft limit = its own CPU time so far + the
  task's budget, which is the rest of the ingest deadline); the kernel's SIGXCPU ends the
  worker, answered `DOCUMENT_TOO_COMPLEX` / `cpu-limit`. The wall-clock deadline normally comes
  first; the CPU limit holds even if the host side stopped watching;
- is reused for the next document (a new process per document would cost ~50 ms of fork and
  tokenizer load each: `bench/ingest.py` requires ingestion within 10 % of raw embedding), and
  retires itself after a task that left its resident memory more than `RECYCLE_RSS_BYTES` above
  its size after start-up, or after `MAX_TASKS` tasks; a killed or retired worker is replaced
  on next use.

Logging: a worker writes nothing to stderr itself; its records reach the host's log with the
document's outcome (`ingest.worker_logs`).

What runs in the worker: extraction always, and chunking too when the corpus's embedding
adapter can describe its token counter as a picklable recipe (`portable_token_counter()`,
which `LocalEmbedding` provides: the worker loads the same pinned tokenizer file). Otherwise
(e.g. a remote model counting with its own library) the worker returns the extracted text and
the host cuts it, in the request thread, with cancel checks between counting batches and the
passage allowance bounding the work.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any, Final, Protocol

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.reasons import DocumentTooComplexReason, HostBusyReason
from retrieval_host.ingest.chunking import Extracted
from retrieval_host.ingest.document import PreparedDocument, extract_document, finish_document
from retrieval_host.ingest.settings import ChunkingSettings, IngestLimits, MiB, too_complex
from retrieval_host.ingest.worker_logs import collect_logs, frames_only, log_records

TokenCounter = Callable[[Sequence[str]], list[int]]

# How often the waiting host thread looks at the cancel token: the bound on the time from a
# disconnect (or the deadline) to the kill.
POLL_S: Final = 0.05
# How long a caller whose worker was stopped by SIGTERM waits for its own cancel to arrive.
TERM_GRACE_S: Final = 1.0
# Tries to start a worker when the fork server exits under it (a Ctrl-C while it starts).
START_ATTEMPTS: Final = 5
# Two workers: the machines this runs on have two to four cores, and parsing is CPU-bound; more
# documents than workers wait (still cancellable) rather than oversubscribing the cores.
DEFAULT_WORKERS: Final = 2
# A worker's address space after start-up is ~400 MiB (the interpreter, pypdf, bs4, the
# tokenizer); the largest accepted input (32 MiB) parses in well under 512 MiB more.
MEMORY_HEADROOM_BYTES: Final = 1024 * MiB
RECYCLE_RSS_BYTES: Final = 256 * MiB
MAX_TASKS: Final = 500
# The fork server's only preload, and the process name by which it knows a worker.
PRELOAD: Final = "retrieval_host.ingest.fork_server"
WORKER_NAME: Final = "retrieval-host-parse-worker"

_log = logging.getLogger(__name__)


class CounterRecipe(Protocol):
    """A picklable description of a token counter, built once in each parse worker."""

    def build(self) -> TokenCounter:
        """Load the counter (the same pinned tokenizer the adapter counts with)."""
        ...


def counter_recipe(embedding: object) -> CounterRecipe | None:
    """The adapter's portable counter recipe, if it offers one (`portable_token_counter()`).
    None for a recipe defined in the host's `__main__` (an application's script), which a
    worker never runs (`ingest.fork_server`): the host then cuts the text itself."""
    method = getattr(embedding, "portable_token_counter", None)
    recipe = method() if callable(method) else None
    if recipe is None or not callable(getattr(recipe, "build", None)):
        return None
    return None if type(recipe).__module__ in ("__main__", "__mp_main__") else recipe


@dataclass(frozen=True)
class ParseTask:
    """One document for a worker: everything `prepare_document` needs except the counter,
    which travels as a recipe (None: the worker only extracts)."""

    data: bytes
    media_type: str
    source_id: str
    revision: str | None
    title: str | None
    metadata: Mapping[str, JSONScalar] | None
    settings: ChunkingSettings
    limits: IngestLimits
    counter: CounterRecipe | None
    cpu_seconds: int


@dataclass
class PoolCounters:
    """What the pool did (for tests and the hostile-input benchmark)."""

    started: int = 0
    killed: int = 0
    retired: int = 0
    start_failures: int = 0  # workers that died (or could not be made) before they started
    tasks: int = 0
    busy: int = 0  # documents in a worker right now


class _Worker:
    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.started = False  # its first message, `_STARTED`, has been read

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(5)
        finally:
            self.conn.close()

    def close(self) -> None:
        """Let it go: closing the pipe ends its loop; kill it if it does not end promptly."""
        self.conn.close()
        self.process.join(1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class ParsePool:
    """Worker processes that parse untrusted documents (see the module docstring).

    Thread-safe. `start` starts the fork server and one worker; without it they start on
    first use, so a pool that never parses costs nothing.
    """

    def __init__(
        self,
        workers: int = DEFAULT_WORKERS,
        *,
        memory_headroom_bytes: int = MEMORY_HEADROOM_BYTES,
        recycle_rss_bytes: int = RECYCLE_RSS_BYTES,
        max_tasks: int = MAX_TASKS,
    ) -> None:
        if workers < 1:
            raise ValueError("a parse pool needs at least one worker")
        self._slots = threading.BoundedSemaphore(workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._memory = memory_headroom_bytes
        self._recycle = recycle_rss_bytes
        self._max_tasks = max_tasks
        self._context: ForkServerContext | None = None
        self._closed = False
        self.counters = PoolCounters()

    def parse(self, task: ParseTask, cancel: CancelToken) -> PreparedDocument | Extracted:
        """Parse in a worker: a `PreparedDocument` when the task carries a counter recipe,
        else the `Extracted` text. Raises the parser's own typed errors, `CANCELLED` (or
        `TIMEOUT`) from `cancel` after killing the worker, and `DOCUMENT_TOO_COMPLEX`
        (`cpu-limit`, `memory-limit`, `parser-exited`) when a limit ended the worker."""
        while not self._slots.acquire(timeout=POLL_S):
            cancel.check()
        try:
            cancel.check()
            worker = self._take()
            try:
                worker.conn.send(task)
            except OSError:  # it died: while idle (killed from outside), or as it started
                if worker.started:  # one fresh try
                    self._discard(worker)
                    worker = self._start()
                    with contextlib.suppress(OSError):  # it could not start: `_await` reads why
                        worker.conn.send(task)
            with self._lock:
                self.counters.busy += 1
            try:
                return self._await(worker, cancel)
            finally:
                with self._lock:
                    self.counters.busy -= 1
        finally:
            self._slots.release()

    def start(self) -> None:
        """Start the fork server and one idle worker now, at host start: the fork server
        loads the worker code that is on disk then, which is the code the host runs (see the
        module docstring). Returns once the worker has started (~1 s for the fork server to
        load); raises `HOST_BUSY` (`parse-worker-unavailable`) if it could not start."""
        worker = self._start()
        self._started(worker, CancelToken())
        self._give_back(worker)

    def close(self) -> None:
        """Stop the idle workers; a parse still running ends its worker when it returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    # --- internals -------------------------------------------------------------------------

    def _await(self, worker: _Worker, cancel: CancelToken) -> PreparedDocument | Extracted:
        if not worker.started:
            self._started(worker, cancel)
        outcome, retire, records = self._receive(worker, cancel)
        log_records(records)
        self.counters.tasks += 1
        if retire:
            self.counters.retired += 1
            self._discard(worker)
        else:
            self._give_back(worker)
        kind, payload = outcome
        if kind == "ok":
            result: PreparedDocument | Extracted = payload
            return result
        code, detail, reason = payload
        raise RetrievalError(ErrorCode(code), detail, reason=reason)

    def _started(self, worker: _Worker, cancel: CancelToken) -> None:
        """Read a new worker's first message: `_STARTED`, or the frames of its failure."""
        message = self._receive(worker, cancel)
        if message != _STARTED:
            self.counters.killed += 1
            worker.kill()
            raise self._could_not_start(f"it failed as it started:\n{message}")
        worker.started = True

    def _receive(self, worker: _Worker, cancel: CancelToken) -> Any:
        """The worker's next message; raises what ended it if it died, and the cancel (after
        killing it) if `cancel` is cancelled first."""
        sentinel = worker.process.sentinel
        while True:
            ready = multiprocessing.connection.wait([worker.conn, sentinel], timeout=POLL_S)
            if worker.conn in ready:
                try:
                    return worker.conn.recv()
                except (EOFError, OSError):
                    raise self._ended(worker, cancel) from None
            if sentinel in ready:
                raise self._ended(worker, cancel)
            try:
                cancel.check()
            except RetrievalError:
                self.counters.killed += 1
                worker.kill()
                raise

    def _ended(self, worker: _Worker, cancel: CancelToken) -> RetrievalError:
        worker.process.join(5)
        exitcode = worker.process.exitcode
        worker.conn.close()
        self.counters.killed += 1
        if not worker.started and exitcode != -signal.SIGTERM:
            # It died before it took the document (probe I, session 42: each new worker
            # failed at import after the package changed on disk): not the document's fault.
            return self._could_not_start(f"it exited with {exitcode} before it started.")
        if exitcode == -signal.SIGTERM:
            # Stopped with its process group (a service manager, `timeout`): no parse ends
            # that way, and the caller's own cancel is on its way (a signal handler runs on
            # the main thread): the document was cancelled, not refused (raised here).
            cancel.wait(TERM_GRACE_S)
        if exitcode == -signal.SIGXCPU:
            return too_complex(
                DocumentTooComplexReason.CPU_LIMIT,
                "parsing the document took more CPU time than allowed.",
            )
        _log.warning("a parse worker exited with %s", exitcode)
        return too_complex(
            DocumentTooComplexReason.PARSER_EXITED,
            "the document could not be parsed within the limits.",
        )

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.conn.close()
        return self._start()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.close()

    def _discard(self, worker: _Worker) -> None:
        worker.close()

    def _start(self) -> _Worker:
        with self._lock:
            if self._context is None:
                context = multiprocessing.get_context("forkserver")
                # The worker code, its parsers' lazy imports and the hook that keeps the
                # host's `__main__` out of a worker (`ingest.fork_server`).
                context.set_forkserver_preload([PRELOAD])
                self._context = context
            context = self._context
        parent, child = context.Pipe(duplex=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            process = context.Process(
                target=_worker_main,
                args=(
                    child,
                    self._memory,
                    self._recycle,
                    self._max_tasks,
                    logging.getLogger("retrieval_host").getEffectiveLevel(),
                ),
                name=WORKER_NAME,
                daemon=True,
            )
            try:
                process.start()
                break
            except (EOFError, OSError) as exc:
                # The first start launches the fork server, which imports the parsers before
                # it ignores SIGINT itself: a Ctrl-C on the terminal (the whole process group)
                # in those seconds kills it, and the ingest ended in a traceback, not its
                # cancel (a black-box test). multiprocessing starts a new one once the old
                # one has exited; the caller's cancel, if that was one, is checked as the
                # parse waits.
                if attempt == START_ATTEMPTS:
                    child.close()
                    parent.close()
                    raise self._could_not_start(frames_only(exc) or "") from exc
                _log.warning("the parse workers' fork server exited; starting another")
                time.sleep(0.1 * attempt)
        child.close()
        self.counters.started += 1
        return _Worker(process, parent)

    def _could_not_start(self, cause: str) -> RetrievalError:
        """A worker that could not start: one log line with the cause, and the host's failure
        for the caller (503: another worker or a new fork server may start)."""
        with self._lock:
            self.counters.start_failures += 1
        _log.error("a parse worker could not start", extra={"fields": {"error": cause}})
        return RetrievalError(
            ErrorCode.HOST_BUSY,
            "The host could not start a document parser; retry later.",
            reason=HostBusyReason.PARSE_WORKER_UNAVAILABLE,
        )


# --- the worker process ----------------------------------------------------------------------


# A worker's first message: it has started and takes documents. Anything else is the traceback
# (frames only) of what stopped it.
_STARTED: Final = "started"


def _worker_main(
    conn: Connection, memory_headroom: int, recycle_rss: int, max_tasks: int, log_level: int
) -> None:
    # The host decides when a worker stops (SIGKILL); Ctrl+C on the host's terminal reaches
    # the whole process group and must not kill a worker mid-answer.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(conn, memory_headroom, recycle_rss, max_tasks, log_level)
    except OSError:
        # The host closed its end (it stopped, or gave up on this worker) while this one
        # answered: there is no one to tell, and a worker never writes to stderr (a host
        # stopped within a second of its start printed a `BrokenPipeError` traceback there,
        # amid its JSON log lines, as the worker it had just started said `_STARTED`).
        return


def _serve(
    conn: Connection, memory_headroom: int, recycle_rss: int, max_tasks: int, log_level: int
) -> None:
    try:
        logs = collect_logs(log_level)
        # One thread: the tokenizer's thread pool would multiply the address space (an arena
        # per thread) and compete with the host's own threads for the same cores.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        limit = _vm_bytes() + memory_headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except Exception as exc:  # the host logs it: a worker never writes to stderr
        conn.send(frames_only(exc))
        return
    conn.send(_STARTED)
    counters: dict[CounterRecipe, TokenCounter] = {}
    baseline_rss: int | None = None
    for done in range(1, max_tasks + 1):
        try:
            task: ParseTask = conn.recv()
        except (EOFError, OSError):
            return
        except MemoryError:  # the document alone does not fit under the limit
            conn.send((("error", _memory_error()), True, logs.take()))
            return
        except Exception:  # a class of the task could not be imported: the host's fault
            _log.exception("a parse worker could not read its document's task")
            conn.send((("error", _task_unreadable()), True, logs.take()))
            return
        _arm_cpu_limit(task.cpu_seconds)
        retire = done == max_tasks
        outcome: tuple[str, Any]
        try:
            outcome = ("ok", _parse(task, counters))
        except RetrievalError as exc:
            outcome = ("error", (exc.code.value, exc.detail, exc.reason))
        except MemoryError:
            outcome = ("error", _memory_error())
            retire = True
        except Exception:  # a parser bug: the document is refused, the worker replaced
            _log.exception("parse worker failed")
            outcome = (
                "error",
                (ErrorCode.INTERNAL.value, "The document could not be parsed.", None),
            )
            retire = True
        rss = _rss_bytes()
        if baseline_rss is None:
            baseline_rss = rss  # after the first task: the tokenizer is loaded by then
        elif rss > baseline_rss + recycle_rss:
            retire = True
        records = logs.take()
        try:
            conn.send((outcome, retire, records))
        except MemoryError:
            conn.send((("error", _memory_error()), True, []))
            return
        if retire:
            return


def _parse(task: ParseTask, counters: dict[CounterRecipe, TokenCounter]) -> Any:
    extracted = extract_document(task.data, task.media_type, title=task.title, limits=task.limits)
    if task.counter is None:
        return extracted
    counter = counters.get(task.counter)
    if counter is None:
        counter = counters[task.counter] = task.counter.build()
    return finish_document(
        extracted,
        task.media_type,
        input_bytes=len(task.data),
        source_id=task.source_id,
        revision=task.revision,
        title=task.title,
        metadata=task.metadata,
        token_counter=counter,
        settings=task.settings,
        limits=task.limits,
    )


def _task_unreadable() -> tuple[str, str, str]:
    return (
        ErrorCode.HOST_BUSY.value,
        "The host could not start a document parser; retry later.",
        HostBusyReason.PARSE_WORKER_UNAVAILABLE.value,
    )


def _memory_error() -> tuple[str, str, str]:
    return (
        ErrorCode.DOCUMENT_TOO_COMPLEX.value,
        "parsing the document needs more memory than allowed.",
        DocumentTooComplexReason.MEMORY_LIMIT.value,
    )


def _arm_cpu_limit(seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + max(1, seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _vm_bytes() -> int:
    return _status_kib("VmSize:") * 1024


def _rss_bytes() -> int:
    return _status_kib("VmRSS:") * 1024

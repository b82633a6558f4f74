"""Run as a script with a copy of the package first on PYTHONPATH: a host process's parse pool.

Like the `retrieval-host` script, its `__main__` imports the whole package (a worker that ran
`__main__` again would import it from disk). It reads one command a line from stdin and
answers each with one JSON line: `start` (the pool's start), `parse` (one Markdown document),
`kill-fork-server` (as the OOM killer would; it waits until the fork server is dead, without
reaping it, so multiprocessing sees it gone and starts another). Every answer carries the
counters and the log records of `retrieval_host` since the last one.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.forkserver
import os
import signal
import sys
from typing import Any

import retrieval_host.serving.cli  # noqa: F401 - as the `retrieval-host` script does
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError
from retrieval_host.ingest import ChunkingSettings, IngestLimits
from retrieval_host.ingest.chunking import Extracted
from retrieval_host.ingest.isolation import ParsePool, ParseTask

DOCUMENT = b"# Quay\n\nBoats moor on the east quay.\n"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None)
        self.records.append(
            {"logger": record.name, "message": record.getMessage(), **(fields or {})}
        )


def _run(pool: ParsePool, command: str) -> dict[str, Any]:
    if command == "start":
        pool.start()
        return {"ok": True}
    if command == "parse":
        task = ParseTask(
            DOCUMENT, "text/markdown", "s", None, None, None,
            ChunkingSettings(), IngestLimits(), None, 30,
        )  # fmt: skip
        extracted = pool.parse(task, CancelToken())
        assert isinstance(extracted, Extracted)
        return {"ok": True, "text": extracted.text}
    if command == "kill-fork-server":
        server: Any = multiprocessing.forkserver._forkserver  # no public handle
        os.kill(server._forkserver_pid, signal.SIGKILL)
        os.waitid(os.P_PID, server._forkserver_pid, os.WEXITED | os.WNOWAIT)
        return {"ok": True}
    raise ValueError(command)


def main() -> None:
    records = _Records()
    logger = logging.getLogger("retrieval_host")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    pool = ParsePool(1, max_tasks=1)  # a new worker for every document
    for line in sys.stdin:
        try:
            answer = _run(pool, line.strip())
        except RetrievalError as exc:
            answer = {"ok": False, "code": exc.code.value, "reason": exc.reason}
        except Exception as exc:  # the answer says what failed (an older pool lacks a method)
            answer = {"ok": False, "exception": type(exc).__name__}
        answer["counters"] = vars(pool.counters)
        answer["logs"], records.records = records.records, []
        print(json.dumps(answer), flush=True)
    pool.close()


if __name__ == "__main__":
    main()

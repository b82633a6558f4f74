"""A parse worker's log records travel to the host and are logged there (`ingest.isolation`).

A worker writes nothing to stderr itself (the host's stream of JSON lines). Every record it
logs (its own, a library's, a `warnings` warning) is collected, at most `MAX_LOG_RECORDS` per
document, and sent back with the document's outcome; the host logs each through its own
configuration, so it is one JSON line like any other (probe S, session 38: a PDF's font name
holding line feeds printed a forged JSON line through Python's last-resort handler). A
traceback travels as its frames and exception types only: an exception's message may quote
the document. A worker killed mid-parse takes its records with it.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from typing import Final

# Log records one document may leave (pypdf logs an error per damaged font: a file's volume).
MAX_LOG_RECORDS: Final = 20

# A log record from a worker: logger name, level, time created, message, and the traceback
# (frames and exception types) if it had one.
WorkerRecord = tuple[str, int, float, str, str | None]


def log_records(records: Sequence[WorkerRecord]) -> None:
    """Log a worker's records here, through the host's handlers and levels."""
    for name, level, created, message, error in records:
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(level):
            continue
        attributes: dict[str, object] = {
            "name": name,
            "levelno": level,
            "levelname": logging.getLevelName(level),
            "msg": message,
            "created": created,
        }
        if error is not None:
            attributes["fields"] = {"error": error}
        logger.handle(logging.makeLogRecord(attributes))


class Collector(logging.Handler):
    """Every record the worker logs, kept for the host (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[WorkerRecord] = []
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) >= MAX_LOG_RECORDS:
            self.dropped += 1
            return
        try:
            message = record.getMessage()
            error = None if record.exc_info is None else frames_only(record.exc_info[1])
        except Exception:  # never a raw line on stderr, which `handleError` would print
            message, error = f"a log record of {record.name} could not be formatted", None
        self.records.append((record.name, record.levelno, record.created, message, error))

    def take(self) -> list[WorkerRecord]:
        """The records since the last call, and a note of those dropped."""
        records, self.records = self.records, []
        if self.dropped:
            note = f"{self.dropped} more log records of the parse worker were dropped"
            records.append((__name__, logging.WARNING, time.time(), note, None))
            self.dropped = 0
        return records


def frames_only(exc: BaseException | None) -> str | None:
    """A traceback as Python prints it, less the exceptions' messages and notes: a parser's
    exception may quote the document (a key or name it read), and no document text is
    logged (`http/logs.py`)."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if not chain:
        return None
    parts = [
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_tb(e.__traceback__))
        + f"{type(e).__module__}.{type(e).__qualname__}"
        for e in reversed(chain)
    ]
    return "\n\nwhich led to\n\n".join(parts)


def collect_logs(level: int) -> Collector:
    """Send every record of this process to a collector: the host's own levels for its
    loggers, warning for libraries (as `http/logs.py` configures the host)."""
    collector = Collector()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(collector)
    root.setLevel(logging.WARNING)
    logging.getLogger("retrieval_host").setLevel(level)
    # A logger that does not propagate and has no handler would reach the last-resort
    # handler, which writes the bare message to stderr; a warning would be printed there.
    logging.lastResort = collector
    logging.captureWarnings(True)
    return collector

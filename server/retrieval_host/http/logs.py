"""Structured JSON logs: one object per line, with the request id where there is one.

What a log line may hold is decided here and in the call sites, never by a library: no token
(only the subject a token maps to), no query string, no search query, no passage or document
text and no generated text. The access log names the route *template* (`/v1/runs/{run_id}`),
not the raw path, so nothing a client puts into a URL reaches the log. uvicorn's own access log
is off (`serving/server.py`): it would print the raw request line, query string included. Loggers of
libraries that log payloads at debug level (sse-starlette logs every event it sends; httpx
every URL it calls) are held at `warning` whatever the host's level.
"""

from __future__ import annotations

import json
import logging
import logging.config
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

ACCESS_LOGGER: Final = "retrieval_host.access"
access_logger = logging.getLogger(ACCESS_LOGGER)

# Libraries whose debug or info records carry payloads or URLs.
_QUIET: Final = ("sse_starlette", "httpx", "httpcore", "uvicorn.access")


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", "requestId"?, ...fields, "error"?}` per record.

    `extra={"request_id": ID}` adds `requestId`; `extra={"fields": {...}}` adds those keys
    (the access log's `method`, `route`, `status`, `durationMs`...). A worker process of a
    host with `listen.workers` > 1 adds its index as `worker` to every line (a black-box test
    could not tell which worker held what).
    """

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            entry["worker"] = self.worker
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["requestId"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                entry.setdefault(str(key), value)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_access(
    *,
    request_id: str,
    method: str,
    route: str,
    status: int,
    duration_s: float,
    response_bytes: int,
    subject: str | None,
    client: str | None,
    problem: tuple[str, str | None] | None = None,
) -> None:
    """One line per request, written when the response has ended (streams included); an
    error's `code` and `reason` (never its detail, which may quote the request)."""
    if not access_logger.isEnabledFor(logging.INFO):
        return
    fields: dict[str, object] = {
        "method": method,
        "route": route,
        "status": status,
        "durationMs": round(duration_s * 1000, 3),
        "responseBytes": response_bytes,
    }
    if subject is not None:
        fields["subject"] = subject
    if client is not None:
        fields["client"] = client
    if problem is not None:
        fields["code"] = problem[0]
        if problem[1] is not None:
            fields["reason"] = problem[1]
    access_logger.info("request", extra={"request_id": request_id, "fields": fields})


def log_config(level: str, worker: int | None = None) -> dict[str, object]:
    """A `logging.config.dictConfig` for uvicorn and the host: JSON lines on stderr (with
    `worker`, each line names that worker).

    The root logger writes JSON too (at `warning`), so a library's warning is still one JSON
    line rather than free text in the stream.
    """
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    loggers: dict[str, object] = {
        name: {"handlers": ["json"], "level": level.upper(), "propagate": False}
        for name in ("uvicorn", "uvicorn.error", "retrieval_host")
    }
    for name in _QUIET:
        loggers[name] = {"handlers": ["json"], "level": "WARNING", "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter", "worker": worker}},
        "handlers": {"json": handler},
        "loggers": loggers,
        "root": {"handlers": ["json"], "level": "WARNING"},
    }


def configure_logging(level: str, worker: int | None = None) -> None:
    """Configure the process's logging (`log_config`) and send Python's `warnings` to it: a
    library's warning is then one JSON line on stderr, not the free text (two lines, a source
    line of the library's) that `warnings.showwarning` prints."""
    logging.config.dictConfig(log_config(level, worker))
    logging.captureWarnings(True)

"""The one request policy every route uses: authenticate, parse, the request context, and the
worker executors through which all request work leaves the event loop.

Authentication comes first (nothing about a request is examined for an unauthenticated
caller); bodies are validated strictly by the wire model (only the documented camelCase names
and JSON types); the context carries the caller's subject, a cancel token the host's shutdown
tracks, and the request id. The Driver is synchronous: every call of it runs on the
executors here, never on the event loop, never on another pool (`anyio.to_thread`, Starlette's
threadpool): one place bounds and names the threads and decides what a disconnect or the
shutdown does to the work.

Searches may have threads of their own (`limits.searchThreads`): a search whose every part
runs in this process (the local model, SQLite, an in-process authorizer) is CPU work, and on
more threads than cores searches only contend for the GIL and the cores. Measured on two
cores against the quickstart host, 16 clients: repeated (cached) queries 17 request threads
3.0 ms of host CPU per search, two search threads 2.0 ms. A thread that waits for its query's
embedding batch keeps its turn: lending it to queued searches (more threads, bigger batches)
measured slower on two cores (540 req/s against 637 for unique queries). A search queued here
still holds its concurrency slot, and is answered like any other when its client leaves or
the host shuts down. With `limits.inlineSearchMs` as well, a short search that calls no model
skips the threads altogether and runs on the event loop (`http/inline.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from email.message import Message as EmailMessage
from typing import Final, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import Receive

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.core.waits import WouldWait, refusing_waits
from retrieval_host.http.auth import Principal, TokenAuthenticator
from retrieval_host.http.inline import InlineSearches, Kind
from retrieval_host.http.limits import SubjectShares
from retrieval_host.http.metrics import HostMetrics, ScanTimer
from retrieval_host.http.request_id import note_subject, request_id_of
from retrieval_host.http.shutdown import Shutdown, shutting_down
from retrieval_host.http.strict import (
    InvalidRequest,
    authorization_header,
    check_unique_keys,
    key_names,
    refuse_non_json_constants,
)
from retrieval_host_client import models as wire

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


# What each pattern of the wire models means, said in words: pydantic's message quotes the
# regular expression, which tells a caller little.
_PATTERN_WORDS: Final = {
    wire.IDENTIFIER_PATTERN: "must be an identifier: 1-256 characters, no control character, "
    "no leading or trailing whitespace, and not `*` alone",
    wire.CHUNK_ID_PATTERN: "must be a citation handle: 1-256 characters, no whitespace, "
    "control character, `[` or `]`, and not `*` alone",
    wire.TEXT_PATTERN: "must not contain the NUL character",
    wire.NOT_BLANK: "must contain a character that is not whitespace, and no NUL",
    r"^[0-9a-f]{64}$": "must be 64 lowercase hexadecimal digits (a SHA-256)",
    "^[0-9a-f]+$": "must be lowercase hexadecimal digits",
    r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$": "must start with a letter or digit and hold only letters, "
    "digits and . _ : / -",
    r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$": "must start with a letter or digit and hold only "
    "letters, digits and . _ : / @ -",
}


def validation_detail(exc: ValidationError, where: str) -> str:
    """Locations and messages only: echoing input values could reflect secrets or passages.

    A list whose items fail is also "too short after validation" when it has a minimum length
    (pydantic counts only the valid items): that second error is false, and left out."""
    errors = exc.errors(include_input=False, include_url=False)
    failing = [tuple(e["loc"]) for e in errors]
    errors = [
        e
        for e in errors
        if not (
            e["type"] == "too_short"
            and any(
                len(f) > len(e["loc"]) and f[: len(e["loc"])] == tuple(e["loc"]) for f in failing
            )
        )
    ]
    parts = []
    for error in errors[:5]:
        loc = ".".join(str(p) for p in error["loc"])
        message = error["msg"]
        if error["type"] == "string_pattern_mismatch":
            pattern = str(error.get("ctx", {}).get("pattern", ""))
            message = _PATTERN_WORDS.get(pattern, "has a character or form that is not allowed")
        parts.append(f"{where}{'.' + loc if loc else ''}: {message}")
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _media_type(request: Request) -> str | None:
    raw = request.headers.get("content-type")
    if raw is None:
        return None
    return _parsed_media_type(raw)


@functools.lru_cache(maxsize=64)
def _parsed_media_type(raw: str) -> str:
    # The email parser's reading of a Content-Type (parameters, case, malformed values), kept
    # for the few distinct values clients send: parsing one costs ~15 us per request.
    parsed = EmailMessage()
    parsed["content-type"] = raw
    return parsed.get_content_type().lower()


# JSON bodies up to this size are parsed on the event loop (a thread hop costs more than
# parsing them); larger ones on a request worker thread.
INLINE_PARSE_BYTES: Final = 64 * 1024


class RequestPolicy:
    """Authenticate, parse, make the context, run the work: the same for every route.

    The worker threads are made on first use and again after `close` (an app whose lifespan
    ends and starts again, as an in-process ASGI test client per request does, keeps serving).
    There are `max_concurrency + 1` of them: the concurrency limit in front of the routes
    bounds how many requests hold one, and the one beyond it keeps the readiness probe (exempt
    from the limit) answering while every slot is busy. With `search_threads`, searches run on
    that many threads of their own instead (see the module docstring).
    """

    def __init__(
        self,
        authenticator: TokenAuthenticator,
        *,
        max_concurrency: int,
        metrics: HostMetrics | None = None,
        shutdown: Shutdown | None = None,
        search_threads: int | None = None,
        inline_search_ms: float = 0.0,
        shares: SubjectShares | None = None,
    ) -> None:
        if search_threads is not None and search_threads < 1:
            raise ValueError("search_threads must be at least 1")
        self.authenticator = authenticator
        self.metrics = metrics
        self.shutdown = shutdown
        self.shares = shares
        self._threads = max_concurrency + 1
        self._search_threads = search_threads
        # Searches that call no model on the event loop (`http/inline.py`): only with search
        # threads, whose setting says every part of a search runs in this process.
        self._inline = (
            InlineSearches(inline_search_ms)
            if search_threads is not None and inline_search_ms > 0
            else None
        )
        self._workers: ThreadPoolExecutor | None = None
        self._searchers: ThreadPoolExecutor | None = None

    @property
    def inlines(self) -> bool:
        """Whether searches that call no model may run on the event loop (`http/inline.py`)."""
        return self._inline is not None

    # --- authenticate, parse, context ------------------------------------------------------

    def authenticate(self, request: Request) -> Principal:
        principal = self.authenticator.authenticate(
            authorization_header(request.scope["headers"]), request.scope.get("query_string", b"")
        )
        note_subject(request.scope, principal.subject)
        if self.shares is not None:
            self.shares.claim(request.scope, principal.subject)
        return principal

    async def parse_json(self, request: Request, model: type[M]) -> M:
        if request.scope.get("query_string"):
            raise InvalidRequest(
                "This route reads its parameters from the JSON body; send no query string.",
                status=400,
                reason=InvalidRequestReason.QUERY_ON_JSON_ROUTE,
            )
        if _media_type(request) != "application/json":
            raise RetrievalError(
                ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                "Send a JSON body (Content-Type: application/json).",
            )
        raw = await request.body()
        if len(raw) <= INLINE_PARSE_BYTES:
            return _parse_json(raw, model)
        # A large body is parsed on a request worker thread: on the event loop, 8 MiB bodies
        # held every other connection up (probes answered in 1-7 s in a black-box test).
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), _parse_json, raw, model)

    def context(
        self,
        principal: Principal,
        request: Request,
        *,
        idle_s: float | None = None,
        observe_scans: bool = True,
    ) -> RequestContext:
        """The context of one request's work; its cancel token is tracked by the shutdown
        (released when `run` returns, or by the caller for work started with `start`)."""
        cancel = CancelToken(idle_s)
        if self.shutdown is not None:
            self.shutdown.track(cancel)
        return RequestContext(
            subject=principal.subject,
            cancel=cancel,
            request_id=request_id_of(request.scope),
            on_progress=(
                self.metrics.scan_timer() if observe_scans and self.metrics is not None else None
            ),
        )

    # --- the worker executors --------------------------------------------------------------

    async def run(
        self,
        request: Request,
        context: RequestContext,
        work: Callable[[], T],
        *,
        search: bool = False,
        inline: Kind | None = None,
    ) -> T:
        """Run `work` in a worker thread (a search thread for a `search`, when the host has
        them); a client disconnect cancels it cooperatively. `inline` is the kind
        (`http.inline.kind_of`) of a search that calls no model: with `inlineSearchMs` it
        runs on the event loop itself while that kind's average allows, refusing every wait
        (then run again on a search thread), and its cost is observed wherever it runs
        (`http/inline.py`).

        Plain asyncio, not a task group and `anyio.to_thread` (their cancel scopes cost more
        than a search over a cached grant). The handler returns only when the work has
        returned, even when the handler itself is cancelled: the work's token is cancelled and
        the thread awaited, so no work outlives its request's concurrency slot. The one
        exception is the host's shutdown: past the cutoff, work that has not returned within
        half the wind-down is answered `CANCELLED` (reason `shutdown`) without it
        (`Shutdown.answer`), so every request ends before the server's own deadline.
        """
        inlining = self._inline if search and inline is not None else None
        try:
            if inlining is None or inline is None:
                return await self._in_thread(request, context, work, search=search)
            if inlining.allows(inline):
                started = time.perf_counter()
                moved = False
                try:
                    with refusing_waits():
                        return work()
                except WouldWait:
                    # It would have waited on the loop: it runs again, whole, on a search
                    # thread (its scan so far is not one).
                    moved = True
                    if isinstance(context.on_progress, ScanTimer):
                        context.on_progress.discard()
                finally:
                    if not moved:
                        inlining.observe(inline, time.perf_counter() - started)
                    if self.metrics is not None:
                        outcome = "moved" if moved else "done"
                        self.metrics.observe_inline_search(inline[0], outcome)
            spent: list[float] = []
            try:
                return await self._in_thread(
                    request, context, functools.partial(_timed, work, spent), search=True
                )
            finally:
                if spent:  # not when the shutdown answered before the work returned
                    inlining.observe(inline, spent[0])
        except RetrievalError as error:
            if (
                error.code is ErrorCode.CANCELLED
                and error.reason != "shutdown"  # already says why (`Shutdown.answer`)
                and self.shutdown is not None
                and self.shutdown.past_cutoff
            ):
                raise shutting_down() from None
            raise
        finally:
            if self.shutdown is not None:
                self.shutdown.release(context.cancel)

    async def _in_thread(
        self, request: Request, context: RequestContext, work: Callable[[], T], *, search: bool
    ) -> T:
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._search_executor() if search else self._executor(), work)
        if self.shutdown is not None:
            done = self.shutdown.answer(done)
        watcher = loop.create_task(_cancel_on_disconnect(request.receive, context.cancel))
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            context.cancel.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(done)
            raise
        finally:
            watcher.cancel()

    async def probe(self, work: Callable[[], T]) -> T:
        """Run a probe's short check (no request context, no cancel) on the same threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor(), work)

    def start(self, work: Callable[[], None]) -> None:
        """Start work that outlives the handler's call (a run whose events an SSE body reads
        in another task): it must report its own outcome and watch its context's token."""
        asyncio.get_running_loop().run_in_executor(self._executor(), work)

    def close(self) -> None:
        """After the server stopped: let the work threads go (they finish what they hold;
        work not yet started is dropped)."""
        for workers in (self._workers, self._searchers):
            if workers is not None:
                workers.shutdown(wait=False, cancel_futures=True)
        self._workers = self._searchers = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(self._threads, thread_name_prefix="request-work")
        return self._workers

    def _search_executor(self) -> ThreadPoolExecutor:
        if self._search_threads is None:
            return self._executor()
        if self._searchers is None:
            self._searchers = ThreadPoolExecutor(
                self._search_threads, thread_name_prefix="search-work"
            )
        return self._searchers


def _timed(work: Callable[[], T], spent: list[float]) -> T:
    """`work()`, appending the CPU time this thread spent on it to `spent`."""
    started = time.thread_time()
    try:
        return work()
    finally:
        spent.append(time.thread_time() - started)


async def _cancel_on_disconnect(receive: Receive, cancel: CancelToken) -> None:
    # The body has been read by now, so the next message is the disconnect (or nothing).
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.cancel()
            return


def _parse_json(raw: bytes, model: type[M]) -> M:
    """The body as `model` (strict, camelCase), or the `INVALID_REQUEST` that says why not."""
    try:
        body = model.model_validate_json(raw, strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        check_unique_keys(raw)  # a repeated key is the first thing wrong with a body
        refuse_non_json_constants(raw)
        invalid = [e for e in exc.errors() if e["type"] == "json_invalid"]
        if any("recursion limit" in str(e.get("ctx", {}).get("error")) for e in invalid):
            raise InvalidRequest(
                "The JSON document nests too deeply.",
                status=400,
                reason=InvalidRequestReason.JSON_DEPTH,
            ) from None
        if any("number out of range" in str(e.get("ctx", {}).get("error")) for e in invalid):
            # Valid JSON, past what Python reads (4,300 digits): said so, not "not valid".
            raise InvalidRequest(
                "A number in the body has more digits than the host reads (4,300).", status=400
            ) from None
        if invalid:
            raise InvalidRequest("The body is not valid JSON.", status=400) from None
        raise InvalidRequest(validation_detail(exc, "body")) from None
    if not key_names(model).rule_out_duplicates(raw):
        check_unique_keys(raw)
    refuse_non_json_constants(raw)
    return body

"""The routes of protocol v1: HTTP in, a call of the in-process driver, HTTP out.

Each retrieval route authenticates first (nothing about the request is examined for an
unauthenticated caller), validates the body with the wire model (strictly: only the
documented camelCase names and JSON types), checks the token's corpus grant, then runs the
synchronous driver call in a worker thread while watching the connection: a client that goes
away sets the call's cancel token, and the work stops at its next check (a search scan between
two batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from email.message import Message as EmailMessage
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Operation
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.http.auth import Principal, TokenAuthenticator
from retrieval_host.http.metrics import HostMetrics
from retrieval_host.http.request_id import note_subject, request_id_of
from retrieval_host.http.shutdown import Shutdown, shutting_down
from retrieval_host.http.strict import (
    InvalidRequest,
    authorization_header,
    check_unique_keys,
    key_names,
    utf8_query_params,
)
from retrieval_host.ingest import MEDIA_TYPES
from retrieval_host.settings import HostSettings
from retrieval_host.wire import retrieval as wire_retrieval
from retrieval_host_client import models as wire

PROTOCOL_NAME: Final = "retrieval-host"
PROTOCOL_VERSION: Final = "1"
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def _validation_detail(exc: ValidationError, where: str) -> str:
    # Locations and messages only: echoing input values could reflect secrets or passages.
    parts = []
    for error in exc.errors(include_input=False, include_url=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}{'.' + loc if loc else ''}: {error['msg']}")
    more = exc.error_count() - len(parts)
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


def ingest_media_types() -> list[str]:
    return sorted(MEDIA_TYPES)


class Routes:
    """The route handlers, bound to one host configuration and (optionally) one driver."""

    def __init__(
        self,
        settings: HostSettings,
        driver: Driver | None,
        authenticator: TokenAuthenticator,
        openapi: Callable[[], Mapping[str, Any]],
        *,
        metrics: HostMetrics | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self.settings = settings
        self.driver = driver
        self.authenticator = authenticator
        self._openapi = openapi
        self.metrics = metrics
        self.shutdown = shutdown
        self._limiter: anyio.CapacityLimiter | None = None
        # The threads request work runs on (searches, writes, ingestion), made on first use;
        # the concurrency limit in front of the routes bounds how many are busy at once.
        self._workers: ThreadPoolExecutor | None = None
        self.started = False
        # A worker of a multi-process host: False until every worker serves (`workers.py`).
        self.workers_ready: bool | None = None

    def routes(self) -> list[Route]:
        public = [
            Route("/v1/protocol", self.protocol, methods=["GET"]),
            Route("/v1/openapi.json", self.openapi, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]
        if self.driver is None:
            return public
        # Search first: the router tries routes in order (the paths are disjoint).
        return [
            Route("/v1/retrieval/search", self.search, methods=["POST"]),
            *public,
            Route("/v1/retrieval/index", self.index, methods=["POST"]),
            Route("/v1/retrieval/ingest", self.ingest, methods=["POST"]),
            Route("/v1/retrieval/delete", self.delete, methods=["POST"]),
        ]

    # --- public ------------------------------------------------------------------------------

    def protocol_info(self) -> wire.ProtocolInfo:
        limits = self.settings.limits
        capabilities = ["scoped-retrieval", "retrieval-indexing"] if self.driver is not None else []
        if self.driver is not None and self.driver.runs is not None:
            capabilities += ["grounded-runs", "run-streaming"]
        return wire.ProtocolInfo(
            name=PROTOCOL_NAME,
            version=PROTOCOL_VERSION,
            capabilities=capabilities,
            limits=wire.ProtocolLimits(
                max_body_bytes=limits.max_body_bytes,
                max_concurrency=limits.max_concurrency,
                header_timeout_s=limits.header_timeout_s,
                body_timeout_s=limits.body_timeout_s,
                ingest_media_types=ingest_media_types() if self.driver is not None else [],
            ),
            auth=wire.ProtocolAuth(scheme="bearer"),
        )

    async def protocol(self, request: Request) -> Response:
        return _model_response(self.protocol_info())

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(dict(self._openapi()))

    async def healthz(self, request: Request) -> Response:
        return _model_response(wire.Health(status="ok"))

    async def readyz(self, request: Request) -> Response:
        checks = {"started": self.started}
        if self.workers_ready is not None:
            checks["workers"] = self.workers_ready
        if self.driver is not None:
            checks["stores"] = await anyio.to_thread.run_sync(self._stores_answer)
        ready = all(checks.values())
        body = wire.Readiness(status="ready" if ready else "unavailable", checks=checks)
        return _model_response(body, status=200 if ready else 503)

    def _stores_answer(self) -> bool:
        # The factory opened every store and loaded every embedding model before the app was
        # built; this confirms each store still answers a read.
        assert self.driver is not None
        try:
            for corpus in self.driver.retrieval.corpora.values():
                corpus.store.get_source(corpus.id, "readyz", "readyz")
        except Exception:
            return False
        return True

    # --- retrieval ---------------------------------------------------------------------------

    async def search(self, request: Request) -> Response:
        principal = self.authenticate(request)
        body = await self.parse_json(request, wire.SearchRequest)
        context = self._context(principal, "search", body.corpus, request)
        driver = self._driver()
        result = await self._run(
            request,
            context,
            lambda: driver.search_context(wire_retrieval.search_request(body), context),
        )
        if self.metrics is not None:
            self.metrics.observe_search(result, body.corpus)
        return Response(wire_retrieval.search_response_json(result), media_type="application/json")

    async def index(self, request: Request) -> Response:
        principal = self.authenticate(request)
        body = await self.parse_json(request, wire.IndexRequest)
        context = self._context(principal, "index", body.corpus, request)
        driver = self._driver()
        result = await self._run(
            request,
            context,
            lambda: driver.index_context(wire_retrieval.index_request(body), context),
        )
        if self.metrics is not None:
            self.metrics.observe_index(result, "index")
        return _model_response(wire_retrieval.index_response(result))

    async def delete(self, request: Request) -> Response:
        principal = self.authenticate(request)
        body = await self.parse_json(request, wire.DeleteRequest)
        context = self._context(principal, "delete", body.corpus, request)
        driver = self._driver()
        result = await self._run(
            request,
            context,
            lambda: driver.delete_context(wire_retrieval.delete_request(body), context),
        )
        return _model_response(wire_retrieval.delete_response(result))

    async def ingest(self, request: Request) -> Response:
        principal = self.authenticate(request)
        params = self._ingest_params(request)
        context = self._context(principal, "index", params.corpus, request)
        media_type = _media_type(request)
        if media_type not in MEDIA_TYPES:
            raise RetrievalError(
                ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                "Send the document with Content-Type one of: "
                + ", ".join(ingest_media_types())
                + ".",
            )
        data = await request.body()
        ingest = IngestRequest(
            params.corpus,
            params.source_id,
            media_type,
            data,
            revision=params.revision,
            title=params.title,
        )
        driver = self._driver()
        deadline_s = self.settings.limits.ingest_deadline_s
        result = await self._run(
            request, context, lambda: driver.ingest_context(ingest, context, deadline_s=deadline_s)
        )
        if self.metrics is not None:
            self.metrics.observe_index(result, "ingest")
        return _model_response(wire_retrieval.index_response(result))

    # --- helpers -----------------------------------------------------------------------------

    def _driver(self) -> Driver:
        assert self.driver is not None  # retrieval routes exist only with a driver
        return self.driver

    def authenticate(self, request: Request) -> Principal:
        principal = self.authenticator.authenticate(
            authorization_header(request.scope["headers"]), request.scope.get("query_string", b"")
        )
        note_subject(request.scope, principal.subject)
        return principal

    def _context(
        self, principal: Principal, operation: Operation, corpus: str, request: Request
    ) -> RequestContext:
        principal.require(operation, corpus)
        cancel = CancelToken()
        if self.shutdown is not None:
            self.shutdown.track(cancel)
        return RequestContext(
            subject=principal.subject,
            cancel=cancel,
            request_id=request_id_of(request.scope),
            on_progress=self.metrics.scan_timer() if self.metrics is not None else None,
        )

    async def parse_json(self, request: Request, model: type[M]) -> M:
        if _media_type(request) != "application/json":
            raise RetrievalError(
                ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                "Send a JSON body (Content-Type: application/json).",
            )
        raw = await request.body()
        try:
            body = model.model_validate_json(raw, strict=True, by_alias=True, by_name=False)
        except ValidationError as exc:
            check_unique_keys(raw)  # a repeated key is the first thing wrong with a body
            if any(e["type"] == "json_invalid" for e in exc.errors()):
                raise InvalidRequest("The body is not valid JSON.", status=400) from None
            raise InvalidRequest(_validation_detail(exc, "body")) from None
        if not key_names(model).rule_out_duplicates(raw):
            check_unique_keys(raw)
        return body

    def _ingest_params(self, request: Request) -> wire.IngestParams:
        params = utf8_query_params(request.scope.get("query_string", b""))
        try:
            return wire.IngestParams.model_validate(
                params, strict=True, by_alias=True, by_name=False
            )
        except ValidationError as exc:
            raise InvalidRequest(_validation_detail(exc, "query")) from None

    def worker_limiter(self) -> anyio.CapacityLimiter:
        # Created on first use: it belongs to the running event loop.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.settings.limits.max_concurrency)
        return self._limiter

    def close(self) -> None:
        """After the server stopped: let the work threads go (they finish what they hold)."""
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=False)

    def _work_threads(self) -> ThreadPoolExecutor:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(
                self.settings.limits.max_concurrency, thread_name_prefix="request-work"
            )
        return self._workers

    async def _run(self, request: Request, context: RequestContext, work: Callable[[], T]) -> T:
        """Run `work` in a worker thread; a client disconnect cancels it cooperatively.

        Plain asyncio, not a task group and `anyio.to_thread` (their cancel scopes cost more
        than a search over a cached grant). The handler returns only when the work has
        returned, even when the handler itself is cancelled: the work's token is cancelled and
        the thread awaited, so no work outlives its request's concurrency slot. The one
        exception is the host's shutdown: past the cutoff, work that has not returned within
        half the wind-down is answered `CANCELLED` (reason `shutdown`) without it
        (`Shutdown.answer`), so every request ends before the server's own deadline.
        """
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._work_threads(), work)
        if self.shutdown is not None:
            done = self.shutdown.answer(done)
        watcher = loop.create_task(_cancel_on_disconnect(request.receive, context.cancel))
        try:
            try:
                return await asyncio.shield(done)
            except asyncio.CancelledError:
                context.cancel.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.shield(done)
                raise
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
            watcher.cancel()
            if self.shutdown is not None:
                self.shutdown.release(context.cancel)


async def _cancel_on_disconnect(receive: Receive, cancel: CancelToken) -> None:
    # The body has been read by now, so the next message is the disconnect (or nothing).
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.cancel()
            return


def _model_response(model: BaseModel, status: int = 200) -> Response:
    return Response(
        model.model_dump_json(by_alias=True), status_code=status, media_type="application/json"
    )

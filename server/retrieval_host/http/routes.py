"""The routes of protocol v1: HTTP in, a call of the in-process driver, HTTP out.

Each retrieval route follows the one request policy (`policy.py`): authenticate, parse the
body strictly, check the token's corpus grant, make the context, then run the synchronous
driver call on the one worker executor while watching the connection: a client that goes
away sets the call's cancel token, and the work stops at its next check (a search scan between
two batches). The routes call only the Driver.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.inspection import DEFAULT_PAGE_LIMIT, SourceFilter, invalid_cursor
from retrieval_host.core.models import IndexResult, Operation
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.http.auth import Principal
from retrieval_host.http.corpus_paths import corpus_param
from retrieval_host.http.ingest_stream import streamed_ingest
from retrieval_host.http.inline import kind_of
from retrieval_host.http.metrics import HostMetrics
from retrieval_host.http.policy import RequestPolicy, validation_detail
from retrieval_host.http.request_id import request_id_of
from retrieval_host.http.sse import wants_stream
from retrieval_host.http.strict import (
    InvalidRequest,
    check_unique_keys,
    no_query_params,
    utf8_query_params,
)
from retrieval_host.ingest import MEDIA_TYPES
from retrieval_host.ingest.settings import normalize_media_type
from retrieval_host.settings import HostSettings
from retrieval_host.wire import retrieval as wire_retrieval
from retrieval_host_client import models as wire

PROTOCOL_NAME: Final = "retrieval-host"
PROTOCOL_VERSION: Final = "1"
# Seconds `/readyz` waits for the stores' answer: one that takes longer is not ready (a probe
# that hangs on a frozen database is killed by the orchestrator's own timeout, reading nothing).
READY_PROBE_S: Final = 5.0


def ingest_media_types() -> list[str]:
    return sorted(MEDIA_TYPES)


class Routes:
    """The route handlers, bound to one host configuration and (optionally) one driver."""

    def __init__(
        self,
        settings: HostSettings,
        driver: Driver | None,
        policy: RequestPolicy,
        openapi: Callable[[], Mapping[str, Any]],
        *,
        metrics: HostMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.driver = driver
        self.policy = policy
        self._openapi = openapi
        self.metrics = metrics
        self.started = False
        # A worker of a multi-process host: False until every worker serves (`serving/workers.py`).
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
            *self.inspection_routes(),
        ]

    # --- public ------------------------------------------------------------------------------

    def protocol_info(self) -> wire.ProtocolInfo:
        limits = self.settings.limits
        capabilities = ["scoped-retrieval"] if self.driver is not None else []
        if self.driver is not None and self.driver.indexing_enabled:
            capabilities.append("retrieval-indexing")
        if self.driver is not None and self.driver.runs_enabled:
            capabilities += ["grounded-runs", "run-streaming"]
        return wire.ProtocolInfo(
            name=PROTOCOL_NAME,
            version=PROTOCOL_VERSION,
            capabilities=capabilities,
            limits=wire.ProtocolLimits(
                max_body_bytes=limits.max_body_bytes,
                max_json_body_bytes=min(limits.max_json_body_bytes, limits.max_body_bytes),
                max_concurrency=limits.max_concurrency,
                header_timeout_s=limits.header_timeout_s,
                body_timeout_s=limits.body_timeout_s,
                ingest_media_types=ingest_media_types() if self.driver is not None else [],
                # What a client's stream reads must outlast (the client raises its read
                # timeout to it): without it, a timeout under the interval cut quiet streams.
                heartbeat_s=self.settings.runs.heartbeat_s,
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
            try:
                checks["stores"] = await asyncio.wait_for(
                    self.policy.probe(self._driver().stores_answer), READY_PROBE_S
                )
            except TimeoutError:  # a store that does not answer (a frozen database) is down
                checks["stores"] = False
        ready = all(checks.values())
        body = wire.Readiness(status="ready" if ready else "unavailable", checks=checks)
        return _model_response(body, status=200 if ready else 503)

    # --- retrieval ---------------------------------------------------------------------------

    async def search(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        body = await self.policy.parse_json(request, wire.SearchRequest)
        context = self._context(principal, "search", body.corpus, request)
        driver = self._driver()
        search = wire_retrieval.search_request(body)
        result = await self.policy.run(
            request,
            context,
            lambda: driver.search_context(search, context),
            search=True,
            # A search that calls no model may run on the event loop (`http/inline.py`).
            inline=(
                kind_of(search, context.subject)
                if self.policy.inlines and driver.search_calls_no_model(search, context.subject)
                else None
            ),
        )
        if self.metrics is not None:
            self.metrics.observe_search(result, body.corpus)
        return Response(wire_retrieval.search_response_json(result), media_type="application/json")

    async def index(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        body = await self.policy.parse_json(request, wire.IndexRequest)
        context = self._context(principal, "index", body.corpus, request)
        driver = self._driver()
        result = await self.policy.run(
            request,
            context,
            lambda: driver.index_context(wire_retrieval.index_request(body), context),
        )
        if self.metrics is not None:
            self.metrics.observe_index(result, "index")
        return _model_response(wire_retrieval.index_response(result))

    async def delete(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        body = await self.policy.parse_json(request, wire.DeleteRequest)
        context = self._context(principal, "delete", body.corpus, request)
        driver = self._driver()
        result = await self.policy.run(
            request,
            context,
            lambda: driver.delete_context(wire_retrieval.delete_request(body), context),
        )
        return _model_response(wire_retrieval.delete_response(result))

    async def ingest(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        params = self._ingest_params(request)
        idle = None if params.idle_timeout_ms is None else params.idle_timeout_ms / 1000
        context = self._context(principal, "index", params.corpus, request, idle_s=idle)
        # Normalized and checked here, before the body is read: the same one normalization
        # `Driver.ingest_context` applies to in-process callers (`normalize_media_type`).
        media_type = normalize_media_type(request.headers.get("content-type", ""))
        data = await request.body()
        ingest = IngestRequest(
            params.corpus,
            params.source_id,
            media_type,
            data,
            revision=params.revision,
            title=params.title,
            metadata=params.metadata,
        )
        driver = self._driver()
        deadline_s = self.settings.limits.ingest_deadline_s

        def work(ctx: RequestContext) -> IndexResult:
            result = driver.ingest_context(ingest, ctx, deadline_s=deadline_s)
            if self.metrics is not None:
                self.metrics.observe_index(result, "ingest")
            return result

        if wants_stream(request):
            return await streamed_ingest(
                self.policy,
                context,
                work,
                request_id=request_id_of(request.scope),
                heartbeat_s=self.settings.runs.heartbeat_s,
                shutdown=self.policy.shutdown,
                scope=request.scope,
            )
        result = await self.policy.run(request, context, lambda: work(context))
        return _model_response(wire_retrieval.index_response(result))

    # --- inspection --------------------------------------------------------------------------
    # GET routes under the token's `search` grant, then the application's authorizer (the
    # Driver): a missing and an unauthorized source answer the same 404. Source and chunk ids
    # may hold `/` (file paths): their segments take the rest of the path.

    def inspection_routes(self) -> list[Route]:
        return [
            Route("/v1/corpora", self.list_corpora, methods=["GET"]),
            Route("/v1/corpora/{corpus}/sources", self.list_sources, methods=["GET"]),
            Route("/v1/corpora/{corpus}/sources/{sourceId:path}", self.get_source, methods=["GET"]),
            Route(
                "/v1/corpora/{corpus}/passages/{chunkId:path}", self.get_passage, methods=["GET"]
            ),
        ]

    async def list_corpora(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        no_query_params(request.scope.get("query_string", b""))
        context = self.policy.context(principal, request)
        driver = self._driver()
        corpora = await self.policy.run(
            request, context, lambda: driver.list_corpora(context, principal.search)
        )
        operations: dict[str, list[Operation]] = {
            c.id: [op for op in _OPERATIONS if principal.may(op, c.id)] for c in corpora
        }
        # What a token that may write where it may not search learns: which of this host's
        # corpora (those that take writes), and how; nothing about their content. "May not
        # search": not listed above, by its grant or the application's answer.
        listed = {c.id for c in corpora}
        writable = (principal.index | principal.delete) - listed
        write_only: dict[str, list[Operation]] = {
            corpus_id: [op for op in ("index", "delete") if principal.may(op, corpus_id)]
            for corpus_id in sorted(writable & driver.writable_corpus_ids())
        }
        return _model_response(wire_retrieval.corpora_response(corpora, operations, write_only))

    async def list_sources(self, request: Request) -> Response:
        principal = self.policy.authenticate(request)
        corpus = corpus_param(request)
        filters = _take(request, ("title", "mediaType"))
        page = self._page_params(request, skip=filters.keys())
        where = SourceFilter(filters.get("title"), filters.get("mediaType"))
        context = self._context(principal, "search", corpus, request)
        driver = self._driver()
        result = await self.policy.run(
            request,
            context,
            _cursor_errors(
                lambda: driver.list_sources(
                    corpus, context, limit=page[0], cursor=page[1], where=where
                )
            ),
        )
        return _model_response(wire_retrieval.sources_response(result))

    async def get_source(self, request: Request) -> Response:
        _no_trailing_slash(request.path_params["sourceId"])
        principal = self.policy.authenticate(request)
        corpus, source_id = corpus_param(request), request.path_params["sourceId"]
        page = self._page_params(request)
        context = self._context(principal, "search", corpus, request)
        driver = self._driver()
        result = await self.policy.run(
            request,
            context,
            _cursor_errors(
                lambda: driver.get_source(corpus, source_id, context, limit=page[0], cursor=page[1])
            ),
        )
        return _model_response(wire_retrieval.source_response(result))

    async def get_passage(self, request: Request) -> Response:
        _no_trailing_slash(request.path_params["chunkId"])
        principal = self.policy.authenticate(request)
        corpus, chunk_id = corpus_param(request), request.path_params["chunkId"]
        query = utf8_query_params(request.scope.get("query_string", b""))
        try:
            params = wire.PassageParams.model_validate(
                dict(query), strict=True, by_alias=True, by_name=False
            )
        except ValidationError as exc:
            raise InvalidRequest(validation_detail(exc, "query")) from None
        context = self._context(principal, "search", corpus, request)
        driver = self._driver()
        result = await self.policy.run(
            request,
            context,
            lambda: driver.get_passage(corpus, chunk_id, context, revision=params.revision),
        )
        return _model_response(wire_retrieval.passage_response(result))

    def _page_params(
        self, request: Request, *, skip: Collection[str] = ()
    ) -> tuple[int, str | None]:
        query = utf8_query_params(request.scope.get("query_string", b""))
        params: dict[str, object] = {k: v for k, v in query.items() if k not in skip}
        raw_limit = params.pop("limit", None)
        if raw_limit is not None:
            text = str(raw_limit)
            if not (text.isascii() and text.isdigit() and len(text) <= 7):
                raise _page_limit()
            params["limit"] = int(text)
        try:
            parsed = wire.PageParams.model_validate(
                params, strict=True, by_alias=True, by_name=False
            )
        except ValidationError as exc:
            if any(e["loc"] == ("limit",) for e in exc.errors()):
                raise _page_limit() from None
            if any(e["loc"] == ("cursor",) for e in exc.errors()):
                raise _cursor_error(invalid_cursor()) from None
            raise InvalidRequest(validation_detail(exc, "query")) from None
        return (parsed.limit or DEFAULT_PAGE_LIMIT), parsed.cursor

    # --- helpers -----------------------------------------------------------------------------

    def _driver(self) -> Driver:
        assert self.driver is not None  # retrieval routes exist only with a driver
        return self.driver

    def _context(
        self,
        principal: Principal,
        operation: Operation,
        corpus: str,
        request: Request,
        *,
        idle_s: float | None = None,
    ) -> RequestContext:
        principal.require(operation, corpus)
        return self.policy.context(principal, request, idle_s=idle_s)

    def _ingest_params(self, request: Request) -> wire.IngestParams:
        query = utf8_query_params(request.scope.get("query_string", b""))
        params: dict[str, Any] = {
            name: value
            for name, value in query.items()
            if value or name not in EMPTY_MEANS_NOT_GIVEN
        }
        if "metadata" in params:
            check_unique_keys(params["metadata"].encode("utf-8"))
        idle = params.get("idleTimeoutMs")
        if isinstance(idle, str) and re.fullmatch(r"-?[0-9]{1,16}", idle):
            params["idleTimeoutMs"] = int(idle)  # the one integer of the query string
        try:
            return wire.IngestParams.model_validate(
                params, strict=True, by_alias=True, by_name=False
            )
        except ValidationError as exc:
            raise InvalidRequest(validation_detail(exc, "query")) from None

    def close(self) -> None:
        """After the server stopped: let the work threads go (they finish what they hold)."""
        self.policy.close()


_OPERATIONS: Final[tuple[Operation, ...]] = ("search", "index", "delete")
# Ingest query parameters whose empty value means "not given": the default revision (the
# content's digest) and the document's own title, as a form left blank means (the console sends
# neither when blank). `title=` stored an empty title while `revision=` was refused (probe I,
# session 42); an empty title is still the in-process API's to give. OpenAPI marks these
# `allowEmptyValue`.
EMPTY_MEANS_NOT_GIVEN: Final = frozenset({"revision", "title"})
T = TypeVar("T")


def _page_limit() -> InvalidRequest:
    return InvalidRequest(
        f"limit must be an integer in 1..{wire.MAX_PAGE_LIMIT}.",
        status=400,
        reason=InvalidRequestReason.PAGE_LIMIT,
    )


def _cursor_error(error: RetrievalError) -> InvalidRequest:
    return InvalidRequest(error.detail, status=400, reason=error.reason)


def _take(request: Request, names: Collection[str]) -> dict[str, str]:
    """The listed query parameters that are present (each at most once: `utf8_query_params`
    refuses repeats)."""
    query = utf8_query_params(request.scope.get("query_string", b""))
    return {k: v for k, v in query.items() if k in names}


def _cursor_errors(work: Callable[[], T]) -> Callable[[], T]:
    """A cursor the host did not return is a malformed request: 400, like a bad `limit`."""

    def run() -> T:
        try:
            return work()
        except RetrievalError as exc:
            if exc.reason == InvalidRequestReason.INVALID_CURSOR:
                raise _cursor_error(exc) from None
            raise

    return run


def _no_trailing_slash(identifier: str) -> None:
    """`.../sources/` and `.../passages/` (an empty id) are a trailing slash on the listing
    routes: the 404 every such path gets (README), not the id rule's 422."""
    if not identifier:
        raise HTTPException(404)


def _model_response(model: BaseModel, status: int = 200) -> Response:
    return Response(
        model.model_dump_json(by_alias=True), status_code=status, media_type="application/json"
    )

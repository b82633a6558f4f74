"""`create_app(settings, driver)`: the host's ASGI application.

The stack, outermost first, all pure ASGI:

0. `CorpusSegments` — a corpus id holding `/` stays one (escaped) segment of the path;
   `ConsoleHeaders` (console on) — its security headers on every answer under `/console/`;
1. `RequestIdMiddleware` — the request id, and `INTERNAL` for anything that escapes;
2. `RequestObserver` — request metrics and the access log line, by route template;
3. `AllowedHostsMiddleware` — the optional Host allow-list (`allowedHosts`);
4. `OriginMiddleware` — the Origin allow-list (and CORS headers for listed origins);
5. `HygieneMiddleware` — no token in any query string, no content coding, one Content-Type;
   `no-store` and `nosniff` on every response;
6. `MetricsEndpoint` — `GET /metrics` (metrics grant), before the concurrency limit;
7. `LimitsMiddleware` — body size and deadline, host-wide concurrency;
8. Starlette routing (never a redirect: see `create_app`), with one exception handler family
   rendering `application/problem+json`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import AsyncIterator, Mapping
from functools import cache
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.cpus import usable_cores
from retrieval_host.driver import Driver
from retrieval_host.http.auth import TokenAuthenticator
from retrieval_host.http.console import ConsoleHeaders, ConsoleRoutes
from retrieval_host.http.corpus_paths import CorpusSegments
from retrieval_host.http.hosts import AllowedHostsMiddleware
from retrieval_host.http.hygiene import HygieneMiddleware
from retrieval_host.http.limits import LimitCounters, LimitsMiddleware, SubjectShares
from retrieval_host.http.metrics import HostMetrics, MetricsEndpoint, RequestObserver
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.origin import OriginMiddleware
from retrieval_host.http.policy import RequestPolicy
from retrieval_host.http.problems import error_response, problem_response
from retrieval_host.http.request_id import (
    RequestIdMiddleware,
    internal_error,
    log_unexpected,
    request_id_of,
)
from retrieval_host.http.routes import Routes, ingest_media_types
from retrieval_host.http.runs import RunRoutes
from retrieval_host.http.shutdown import Shutdown
from retrieval_host.settings import HostSettings


def _version() -> str:
    try:
        return importlib.metadata.version("retrieval-host")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0"


def search_threads(setting: int | Literal["cores"] | None) -> int | None:
    """`limits.searchThreads` as a number of threads ("cores": those this process may use)."""
    return usable_cores() if setting == "cores" else setting


class HostApp:
    """The ASGI application, with the handles operators and tests read (counters, routes,
    metrics) and the server drives (`shutdown`)."""

    def __init__(
        self,
        asgi: ASGIApp,
        routes: Routes,
        limits: LimitsMiddleware,
        origins: OriginMiddleware,
        *,
        metrics: HostMetrics,
        shutdown: Shutdown,
    ) -> None:
        self._asgi = asgi
        self.routes = routes
        self._limits = limits
        self._origins = origins
        self.metrics = metrics
        self.shutdown = shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)

    @property
    def counters(self) -> LimitCounters:
        return self._limits.counters

    @property
    def shares(self) -> SubjectShares:
        return self._limits.shares

    @property
    def origin_rejections(self) -> int:
        return self._origins.rejected


async def _retrieval_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RetrievalError)
    return error_response(exc, request_id_of(request.scope))


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    # Routing errors (unknown path 404, wrong method 405) keep their HTTP status.
    detail = "No such route." if exc.status_code == 404 else "Method not allowed on this route."
    error = RetrievalError(ErrorCode.INVALID_REQUEST, detail, reason="route")
    return problem_response(
        error, request_id_of(request.scope), status=exc.status_code, headers=exc.headers
    )


async def _client_disconnect(request: Request, exc: Exception) -> Response:
    # Nobody reads this: the client left while sending its body.
    error = RetrievalError(ErrorCode.CANCELLED, "The client disconnected.")
    return problem_response(error, request_id_of(request.scope))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Logged here, before answering, so the log line exists by the time the caller sees 500.
    log_unexpected(exc, request.scope)
    return problem_response(internal_error(), request_id_of(request.scope))


def create_app(settings: HostSettings, driver: Driver | None) -> HostApp:
    """Build the host's ASGI application for one configuration and one driver.

    `driver` is what the application factory returned; `None` serves discovery only (no
    retrieval capabilities, no retrieval routes).
    """

    runs_enabled = driver is not None and driver.runs_enabled

    @cache
    def openapi() -> Mapping[str, Any]:
        return build_openapi(
            version=_version(),
            ingest_media_types=ingest_media_types() if driver is not None else [],
            retrieval=driver is not None,
            runs=runs_enabled,
        )

    metrics = HostMetrics()
    shutdown = Shutdown(settings.limits.shutdown_grace_s)
    authenticator = TokenAuthenticator(settings.tokens)
    shares = SubjectShares(settings.limits)
    policy = RequestPolicy(
        authenticator,
        max_concurrency=settings.limits.max_concurrency,
        metrics=metrics,
        shutdown=shutdown,
        search_threads=search_threads(settings.limits.search_threads),
        inline_search_ms=settings.limits.inline_search_ms,
        shares=shares,
    )
    routes = Routes(settings, driver, policy, openapi, metrics=metrics)
    table = routes.routes()
    if driver is not None and runs_enabled:
        run_routes = RunRoutes(
            driver,
            policy,
            heartbeat_s=settings.runs.heartbeat_s,
            metrics=metrics,
            shutdown=shutdown,
        )
        table += run_routes.routes()
    if settings.console.enabled:
        table += ConsoleRoutes().routes()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        routes.started = True
        try:
            yield
        finally:
            routes.started = False
            routes.close()

    starlette = Starlette(
        routes=table,
        exception_handlers={
            RetrievalError: _retrieval_error,
            HTTPException: _http_exception,
            ClientDisconnect: _client_disconnect,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )
    # Starlette answers `/path/` with a 307 to `/path` built from the request's Host header:
    # an unauthenticated redirect anywhere. Every route has one spelling; others are 404.
    starlette.router.redirect_slashes = False
    limits = LimitsMiddleware(starlette, settings.limits, shares)
    origins = OriginMiddleware(
        HygieneMiddleware(MetricsEndpoint(limits, metrics, settings.tokens), authenticator),
        settings.allowed_origins,
        same_origin=settings.console.enabled,
    )
    hosts = AllowedHostsMiddleware(origins, settings.allowed_hosts)
    counters = limits.counters
    metrics.watch(
        in_flight=lambda: counters.in_flight,
        limit=settings.limits.max_concurrency,
        rejections=lambda: {
            "busy": counters.busy_rejections,
            "ingest-bytes": counters.ingest_bytes_rejections,
            "subject-busy": shares.rejections,
            "body-too-large": counters.too_large_rejections,
            "body-timeout": counters.body_timeouts,
            "origin": origins.rejected,
            "host": hosts.rejected,
        },
        stores=driver.stores if driver is not None else [],
    )
    observed = RequestObserver(hosts, metrics, table)
    outer: ASGIApp = RequestIdMiddleware(observed)
    if settings.console.enabled:
        outer = ConsoleHeaders(outer)
    return HostApp(
        CorpusSegments(outer),
        routes,
        limits,
        origins,
        metrics=metrics,
        shutdown=shutdown,
    )

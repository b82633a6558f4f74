"""Prometheus metrics and the per-request observer (metrics and the access log).

Every app has its own `CollectorRegistry`, so several apps in one process (tests) never share
or collide on a family. Families (all prefixed `retrieval_host_`), with their labels:

- `http_requests_total{method, route, status}`: every request, by route *template*;
- `http_request_duration_seconds{route}`: histogram, to the end of the response (a run
  stream's whole duration);
- `concurrency_in_use`, `concurrency_limit`: gauges of the host-wide concurrency limit;
- `limit_rejections_total{reason}`: busy, subject-busy, body-too-large, body-timeout, origin,
  host;
- `search_scan_duration_seconds{corpus}`: histogram of the store scan of each search (also
  the searches inside runs);
- `embedding_requests_total{operation, corpus}`, `embedding_input_tokens_total{...}`: the
  embedding usage that search, index, ingest and run results report;
- `searches_on_loop_total{corpus, outcome}`: searches started on the event loop itself, not
  a search thread (`limits.inlineSearchMs`, `http/inline.py`): `done` there, or `moved` to a
  search thread where they would have waited;
- `runs_total{outcome, code}`: each run's final event (completed, replayed, failed, cancelled);
- `store_scans_started_total`, `store_scans_cancelled_total`, `store_rows_scored_total`,
  `store_approximate_searches_total`: the stores' own counters, summed over the distinct
  stores.

Embedding usage is counted from results: a run that fails after embedding its query is not
counted (its usage is not reported on `run.failed`). `GET /metrics` is served before the
concurrency limit (a saturated host must still be observable) and is not counted in
`concurrency_in_use`; it needs a token with `metrics: true`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage, IndexResult, JSONValue, SearchResult
from retrieval_host.core.ports import VectorStore
from retrieval_host.core.runs_model import RunCompleted, RunEvent, RunFailed, RunProgress
from retrieval_host.http.auth import WWW_AUTHENTICATE, TokenAuthenticator
from retrieval_host.http.logs import log_access
from retrieval_host.http.problems import send_problem
from retrieval_host.http.request_id import (
    note_subject,
    request_id_of,
    stream_failure_of,
    subject_of,
)
from retrieval_host.http.strict import authorization_header
from retrieval_host.settings import TokenSettings
from retrieval_host.wire.problems import PROBLEM_MEDIA_TYPE

METRICS_PATH: Final = "/metrics"
UNMATCHED_ROUTE: Final = "unmatched"
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Requests range from a probe (~1 ms) to a grounded run streamed for minutes.
REQUEST_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SCAN_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# Bytes of an error response read for its code and reason (a problem body is far smaller).
_PROBLEM_BYTES: Final = 8192


class _Live:
    """A collector that reads its values at scrape time (gauges of current state, and
    counters kept elsewhere: the limits middleware's and the stores')."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class HostMetrics:
    """The host's metric families in a registry of their own; thread-safe (run workers report
    from their threads)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._request_series: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._usage_series: dict[tuple[Counter, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "retrieval_host_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "retrieval_host_http_request_duration_seconds",
            "Time to the end of the response (a run stream's whole duration), by route.",
            ["route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.scan = Histogram(
            "retrieval_host_search_scan_duration_seconds",
            "Time a search spent in the vector store's scan, by corpus.",
            ["corpus"],
            buckets=SCAN_BUCKETS,
            registry=r,
        )
        self.embedding_requests = Counter(
            "retrieval_host_embedding_requests",
            "Embedding model requests reported by results, by operation and corpus.",
            ["operation", "corpus"],
            registry=r,
        )
        self.embedding_tokens = Counter(
            "retrieval_host_embedding_input_tokens",
            "Embedding input tokens reported by results, by operation and corpus.",
            ["operation", "corpus"],
            registry=r,
        )
        self.inline_searches = Counter(
            "retrieval_host_searches_on_loop",
            "Searches started on the event loop rather than a search thread "
            "(limits.inlineSearchMs), by corpus and outcome: done there, or moved to a search "
            "thread where it would have waited.",
            ["corpus", "outcome"],
            registry=r,
        )
        self.streamed_failures = Counter(
            "retrieval_host_streamed_failures",
            "Streamed responses (SSE runs and ingests, status 200 once they started) that "
            "ended in a failed event, by route template and error code.",
            ["route", "code"],
            registry=r,
        )
        self.runs = Counter(
            "retrieval_host_runs",
            "Grounded runs by outcome (completed, replayed, failed, cancelled) and error code.",
            ["outcome", "code"],
            registry=r,
        )
        self._in_flight: Callable[[], int] = lambda: 0
        self._limit = 0
        self._rejections: Callable[[], Mapping[str, int]] = dict
        self._protocol_rejections: Callable[[], Mapping[str, int]] = dict
        self._stores: Sequence[VectorStore] = ()
        r.register(_Live(self._collect_live))

    def watch(
        self,
        *,
        in_flight: Callable[[], int],
        limit: int,
        rejections: Callable[[], Mapping[str, int]],
        stores: Iterable[VectorStore],
    ) -> None:
        """Where the scrape-time values come from (the middleware and stores of one app)."""
        self._in_flight = in_flight
        self._limit = limit
        self._rejections = rejections
        unique = {id(s): s for s in stores}
        self._stores = list(unique.values())

    def watch_protocol(self, rejections: Callable[[], Mapping[str, int]]) -> None:
        """Where the connections' own refusals are counted (`serving.server_protocol`): the
        server's protocol class, made after the app (a black-box test's slow headers, 431s
        and unparsable requests were in no metric)."""
        self._protocol_rejections = rejections

    def render(self) -> bytes:
        """The Prometheus text exposition of every family."""
        return generate_latest(self.registry)

    # --- observations --------------------------------------------------------------------------

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "OTHER"
        # The labelled series of a (method, route, status), looked up once: `labels()` takes a
        # lock and validates its arguments on every call. All three labels are bounded.
        key = (method, route, status)
        series = self._request_series.get(key)
        if series is None:
            series = (self.requests.labels(method, route, str(status)), self.duration.labels(route))
            self._request_series[key] = series
        series[0].inc()
        series[1].observe(seconds)

    def observe_streamed_failure(self, route: str, code: str) -> None:
        self._series(self.streamed_failures, route, code).inc()

    def observe_usage(self, operation: str, corpus: str, usage: EmbeddingUsage) -> None:
        if usage.requests:
            self._series(self.embedding_requests, operation, corpus).inc(usage.requests)
        if usage.input_tokens:
            self._series(self.embedding_tokens, operation, corpus).inc(usage.input_tokens)

    def _series(self, metric: Counter, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per bounded label set."""
        key = (metric, labels)
        series = self._usage_series.get(key)
        if series is None:
            series = self._usage_series[key] = metric.labels(*labels)
        return series

    def observe_search(self, result: SearchResult, corpus: str) -> None:
        self.observe_usage("search", corpus, result.usage)

    def observe_inline_search(self, corpus: str, outcome: str) -> None:
        self._series(self.inline_searches, corpus, outcome).inc()

    def observe_index(self, result: IndexResult, operation: str) -> None:
        self.observe_usage(operation, result.corpus, result.usage)

    def observe_run_event(self, event: RunEvent) -> None:
        """Count a run's final event (called in the run's worker thread, for every event)."""
        if isinstance(event, RunCompleted):
            result = event.result
            if result.replayed:
                # A replay repeats no embedding or generation: nothing more to meter.
                self.runs.labels("replayed", "").inc()
                return
            self.runs.labels("completed", "").inc()
            self.observe_usage("run", result.corpus or "", result.usage.embedding)
        elif isinstance(event, RunFailed):
            code = event.error.code
            outcome = "cancelled" if code is ErrorCode.CANCELLED else "failed"
            self.runs.labels(outcome, code.value).inc()

    def scan_timer(self) -> ScanTimer:
        """A progress sink that times the store scan of each search it sees reported."""
        return ScanTimer(self.scan)

    def _collect_live(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "retrieval_host_concurrency_in_use",
            "Requests holding a slot of the host-wide concurrency limit (probes, discovery and "
            "/metrics hold none).",
            value=self._in_flight(),
        )
        yield GaugeMetricFamily(
            "retrieval_host_concurrency_limit",
            "The host-wide concurrency limit (limits.maxConcurrency).",
            value=self._limit,
        )
        rejections = CounterMetricFamily(
            "retrieval_host_limit_rejections",
            "Requests refused by a shared limit, the Origin or Host allow-list, or the "
            "connection's own bounds (header deadline and size, HTTP that does not parse, "
            "pipelined requests), by reason.",
            labels=["reason"],
        )
        refused = {**self._rejections(), **self._protocol_rejections()}
        for reason, count in sorted(refused.items()):
            rejections.add_metric([reason], count)
        yield rejections
        totals = dict.fromkeys(
            ("scans_started", "scans_cancelled", "rows_scored", "approximate_searches"), 0
        )
        for store in self._stores:
            counters = getattr(store, "counters", None)
            for name in totals:
                value = getattr(counters, name, 0)
                totals[name] += value if isinstance(value, int) else 0
        for name, help_text in (
            ("scans_started", "Vector scans the stores started."),
            ("scans_cancelled", "Vector scans the stores stopped because the request ended."),
            ("rows_scored", "Stored vectors the stores scored."),
            (
                "approximate_searches",
                "Dense searches the stores ranked with a graph or HNSW index.",
            ),
        ):
            yield CounterMetricFamily(f"retrieval_host_store_{name}", help_text, value=totals[name])


class ScanTimer:
    """Times the span between the `retrieval.scan` progress report and the next report (the
    service reports the scan right before calling the store and the next phase right after)."""

    def __init__(self, histogram: Histogram) -> None:
        # One timer per request, called from the one thread doing its work: no lock needed.
        self._histogram = histogram
        self._started: float | None = None
        self._corpus = ""

    def discard(self) -> None:
        """Forget a scan in progress (a search that stopped to run again elsewhere)."""
        self._started = None

    def __call__(self, phase: str, details: Mapping[str, JSONValue]) -> None:
        now = time.perf_counter()
        if self._started is not None:
            self._histogram.labels(self._corpus).observe(now - self._started)
            self._started = None
        if phase == "retrieval.scan":
            corpus = details.get("corpus")
            self._corpus = corpus if isinstance(corpus, str) else ""
            self._started = now

    def observe_event(self, event: RunEvent) -> None:
        if isinstance(event, RunProgress):
            self(event.phase, event.context)


# --- ASGI ----------------------------------------------------------------------------------------


_CONVERTOR: Final = re.compile(r":[a-z]+\}")


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template of the route this request is for (`unmatched` when none is): a
    bounded label, and nothing a client typed into the URL."""
    if scope["path"] == METRICS_PATH:
        return METRICS_PATH
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            path = getattr(route, "path", None)
            # `{run_id:path}` is `{run_id}` to an operator: the convertor is routing detail.
            return _CONVERTOR.sub("}", path) if isinstance(path, str) else UNMATCHED_ROUTE
    return UNMATCHED_ROUTE


class RequestObserver:
    """Pure ASGI, just inside `RequestIdMiddleware`: counts and times every request by route
    template and status, and writes its access log line when the response has ended."""

    def __init__(self, app: ASGIApp, metrics: HostMetrics, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = list(routes)
        # Templates of paths without parameters, by path (a bounded set: the routes' own paths).
        self._templates: dict[str, str] = {}

    def _template(self, scope: Scope) -> str:
        route = route_template(self.routes, scope)
        if route == scope["path"] and "{" not in route:
            self._templates[route] = route
        return route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = self._templates.get(scope["path"]) or self._template(scope)
        status = 0
        sent = 0
        problem: bytearray | None = None  # an error's body, for its code in the access log

        async def observed_send(message: Message) -> None:
            nonlocal status, sent, problem
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if (b"content-type", PROBLEM_MEDIA_TYPE.encode("ascii")) in message.get(
                    "headers", ()
                ):
                    problem = bytearray()
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                sent += len(body)
                if problem is not None and len(problem) < _PROBLEM_BYTES:
                    problem += body[: _PROBLEM_BYTES - len(problem)]
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        except BaseException as exc:
            if status == 0:
                # What the request id middleware answers (an error), or nobody (a cancel).
                status = 500 if isinstance(exc, Exception) else 499
            raise
        finally:
            if status == 0:
                status = 500  # the application never answered: the server sends 500
            elapsed = time.perf_counter() - started
            method = str(scope.get("method", ""))
            self.metrics.observe_request(method, route, status, elapsed)
            failed = _code_and_reason(problem) or stream_failure_of(scope)
            if failed is not None and problem is None:
                self.metrics.observe_streamed_failure(route, failed[0])
            client = scope.get("client")
            log_access(
                request_id=request_id_of(scope),
                method=method if method in _METHODS else "OTHER",
                route=route,
                status=status,
                duration_s=elapsed,
                response_bytes=sent,
                subject=subject_of(scope),
                client=str(client[0]) if client else None,
                problem=failed,
            )


def _code_and_reason(body: bytearray | None) -> tuple[str, str | None] | None:
    """An error response's `code` and `reason` (an operator told a missing grant from an
    unknown subject only by asking the client for its problem body, a black-box test)."""
    if not body:
        return None
    try:
        parsed = json.loads(bytes(body))
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("code"), str):
        return None
    reason = parsed.get("reason")
    return parsed["code"], reason if isinstance(reason, str) else None


class MetricsEndpoint:
    """Pure ASGI: answers `GET /metrics` for a token with the metrics grant (401 without a
    valid token, 403 without the grant) and passes every other request on.

    It sits outside the limits middleware, so a scrape needs no concurrency slot and is not
    counted as one."""

    def __init__(self, app: ASGIApp, metrics: HostMetrics, tokens: Sequence[TokenSettings]) -> None:
        self.app = app
        self.metrics = metrics
        self._tokens = TokenAuthenticator(tokens)
        self._granted = TokenAuthenticator([t for t in tokens if t.metrics])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != METRICS_PATH:
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        if scope["method"] not in ("GET", "HEAD"):
            error = RetrievalError(
                ErrorCode.INVALID_REQUEST, "Method not allowed on this route.", reason="route"
            )
            await send_problem(
                send, error, request_id, status=405, extra_headers=[(b"allow", b"GET, HEAD")]
            )
            return
        try:
            authorization = authorization_header(scope["headers"])
            principal = self._tokens.authenticate(authorization, scope.get("query_string", b""))
            try:
                self._granted.authenticate(authorization, b"")
            except RetrievalError:
                # Said plainly: unlike a corpus grant, naming this one reveals nothing.
                raise RetrievalError(
                    ErrorCode.PERMISSION_DENIED,
                    "This token lacks the metrics grant (`metrics: true` in its entry).",
                ) from None
        except RetrievalError as error:
            extra = (
                [(b"www-authenticate", WWW_AUTHENTICATE.encode("ascii"))]
                if error.code is ErrorCode.UNAUTHENTICATED
                else []
            )
            await send_problem(send, error, request_id, extra_headers=extra)
            return
        note_subject(scope, principal.subject)
        body = self.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE_LATEST.encode("ascii")),
                    (b"content-length", str(len(body)).encode("ascii")),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        payload = b"" if scope["method"] == "HEAD" else body
        await send({"type": "http.response.body", "body": payload, "more_body": False})

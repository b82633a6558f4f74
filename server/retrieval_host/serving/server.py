"""Serving the host with uvicorn: TLS policy, header deadline protocol, loop and logging, the
loopback metrics port, and the graceful shutdown.

On SIGTERM (or SIGINT, SIGHUP) `HostServer` stops accepting connections, closes idle keep-alive
connections and lets the requests in flight finish; at the app's cutoff (`shutdown.py`) the
work still running is cancelled and open run streams end with a final `run.failed`
(`CANCELLED`, reason `shutdown`); after `limits.shutdownGraceS` uvicorn cancels whatever is
left, runs the app's lifespan shutdown, and `serve` returns. The caller then closes the stores
and the process exits 0 (uvicorn on its own would re-raise the signal after shutting down, and
the default SIGTERM action would end the process before the stores are closed). A signal
that comes while the host starts is recorded and honoured between its steps (`EarlyStop`).
A second SIGINT or SIGTERM, while the host starts, drains or closes its stores, ends it at
once (`exit_at_once`), as uvicorn and gunicorn end on a second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import uvicorn
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from retrieval_host.driver import Driver
from retrieval_host.http.app import HostApp, create_app
from retrieval_host.http.hosts import host_name
from retrieval_host.http.logs import log_config
from retrieval_host.ingest.isolation import ParsePool
from retrieval_host.serving.event_loop import bounded_handshakes
from retrieval_host.serving.server_protocol import HeaderDeadlineProtocol
from retrieval_host.serving.tls import server_context
from retrieval_host.settings import HostSettings, SettingsError

if TYPE_CHECKING:
    from retrieval_host.serving.workers import WorkerSeat


class PlainHttpRefused(Exception):
    """The configuration would serve plain HTTP where that is not allowed."""


def uvicorn_config(
    settings: HostSettings,
    app: object,
    environ: Mapping[str, str],
    *,
    log_config: dict[str, object] | None = None,
) -> uvicorn.Config:
    """A uvicorn configuration that enforces the host's transport policy.

    TLS (1.2 minimum, see `tls.server_context`) unless the settings say the host runs behind a
    TLS-terminating proxy on loopback (already validated in `HostSettings`; checked again here
    so no caller can bypass it).
    """
    protocol = HeaderDeadlineProtocol.with_timeouts(
        settings.limits.header_timeout_s, settings.limits.body_timeout_s
    )
    if isinstance(app, HostApp):
        app.metrics.watch_protocol(protocol.rejections)
    config_kwargs: dict[str, object] = {}
    if settings.tls is not None:
        password = settings.tls_key_password(environ)
        context = server_context(
            settings.tls.cert_file,
            settings.tls.key_file,
            password.get_secret_value() if password is not None else None,
            warn=False,  # said at the start's own check (`serving.cli`)
        )
        config_kwargs["ssl_context_factory"] = lambda _config, _default: context
    elif not settings.behind_proxy:
        raise PlainHttpRefused("TLS is required unless behindProxy is set on a loopback host")
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.listen.host,
        port=settings.listen.port,
        http=protocol,
        # uvloop, with TLS handshakes held to the header deadline (`serving.event_loop`).
        loop=bounded_handshakes(settings.limits.header_timeout_s),
        ws="none",  # no WebSocket routes: do not even load a WebSocket implementation
        lifespan="on",
        # Forwarded headers are trusted only from a proxy we are told about, on loopback.
        proxy_headers=settings.behind_proxy,
        forwarded_allow_ips="127.0.0.1,::1" if settings.behind_proxy else "",
        server_header=False,
        access_log=False,
        log_config=log_config,
        log_level=settings.log_level,
        timeout_keep_alive=5,
        # Whole seconds for uvicorn; the app's own cutoff comes earlier (`shutdown.py`).
        timeout_graceful_shutdown=math.ceil(settings.limits.shutdown_grace_s),
        **config_kwargs,  # type: ignore[arg-type]
    )


logger = logging.getLogger("retrieval_host.http")
# SIGHUP too: a host started from a terminal that closes, or told to "reload" by a service
# manager, stops as on SIGTERM (its stores closed) instead of dying at once; it has no reload.
SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The signals that, coming again once a stop has begun, end the process at once. Not SIGHUP:
# a terminal that closes often sends it twice (`ingest`'s cancel escalates on Ctrl-C alone).
FORCING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_at_once(sig: int, step: str) -> NoReturn:
    """End the process now, for a second SIGINT or SIGTERM: one line naming what it does not
    wait for (`step`), then exit 128 + the signal's number (130 for SIGINT, 143 for SIGTERM:
    what a shell reports for a process a signal ended, and not 0, since the stop was cut
    short), with the stores left as they are. Before this, an operator's second Ctrl-C, or a
    supervisor's second SIGTERM, waited for the whole step: a start loading a large store,
    the grace period, a close (signals helper, session 43).

    Nothing committed is lost: a SQLite commit is on disk when it returns (WAL,
    `synchronous=FULL`), one cut short is rolled back when the store next opens, and
    PostgreSQL rolls back a transaction whose connection ends. A request or stream in flight
    loses its connection, and a run under way reads `INTERRUPTED` once its lease lapses."""
    logger.warning("second %s: exiting without waiting for %s", signal.Signals(sig).name, step)
    logging.shutdown()  # flushes stderr's handler: `os._exit` skips the interpreter's exit
    os._exit(128 + sig)


class EarlyStop:
    """The shutdown signals (SIGTERM, SIGINT, SIGHUP) received while the host starts, before
    `HostServer` takes them: recorded, never acted on in the middle of a step.

    With their default action a stop during the start ended a single host with 143, its
    stores left unclosed (a migration cut wherever it was), and a worker with -15, which its
    supervisor counted as a worker that died: exit 1 with no line saying why (probe O,
    session 40). `serve` checks `signal` between steps and stops cleanly, exit 0: before the
    application opens the stores (nothing to close), once they are open (closed first; a
    migration runs to its end), or as the server starts (it shuts down at once, `HostServer`).
    While `watching`, a signal after the server has stopped is recorded too: closing the
    stores is not cut short either.

    A second SIGINT or SIGTERM does not wait: it ends the process at once (`exit_at_once`),
    naming `step`, the step under way, which `serve` keeps up to date. Not in a worker
    (`second_exits=False`): under systemd's default `KillMode` every process of the service
    gets the SIGTERM besides the one its supervisor forwards, so a worker's second signal is
    no operator's; the supervisor ends its workers itself on its own second signal."""

    def __init__(self, *, second_exits: bool = True) -> None:
        self.signal: int | None = None
        self.step = "the configuration checks"
        self.second_exits = second_exits

    @property
    def name(self) -> str:
        """The first signal's name (`SIGTERM`); "" when none came."""
        return "" if self.signal is None else signal.Signals(self.signal).name

    def _record(self, sig: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = sig
            # At once, not only between steps: the operator learns the stop was heard, and
            # how not to wait for it.
            logger.info(
                "received %s while waiting for %s: stopping then%s",
                signal.Signals(sig).name,
                self.step,
                " (SIGINT or SIGTERM again exits at once)" if self.second_exits else "",
            )
        elif self.second_exits and sig in FORCING_SIGNALS:
            exit_at_once(sig, self.step)

    @contextlib.contextmanager
    def watching(self) -> Iterator[EarlyStop]:
        """Record the shutdown signals while the block runs (main thread only: signals are
        delivered there), then restore the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._record) for sig in SHUTDOWN_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class HostServer(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown begins and exiting normally after it;
    `on_serving` is called once its listeners accept connections. A signal `early` recorded
    during the start stops it as soon as it starts (it then never says it serves). A second
    SIGINT or SIGTERM ends the process at once (`exit_at_once`; not with an `early` whose
    `second_exits` is off: a worker's)."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: HostApp | None = None,
        *,
        on_serving: Callable[[], None] | None = None,
        early: EarlyStop | None = None,
    ) -> None:
        super().__init__(config)
        self._host_app = app
        self._on_serving = on_serving
        self._early = early

        self.signalled: int | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # `started` is set once every listener has been created (listening, accepting).
        if self.started and not self.should_exit and self._on_serving is not None:
            self._on_serving()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = sig
            if self._early is not None and self._early.signal is None:
                # So that a second signal while the stores close ends the process too.
                self._early.signal = sig
        elif sig in FORCING_SIGNALS and (self._early is None or self._early.second_exits):
            exit_at_once(
                sig, "the requests in flight to end" if self.started else "the server to start"
            )
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.signalled is not None:
            logger.info("received %s", signal.Signals(self.signalled).name)
        # Before uvicorn closes the listeners and starts waiting for the requests in flight.
        if self._host_app is not None:
            self._host_app.shutdown.begin()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Route SIGINT/SIGTERM/SIGHUP to `handle_exit` while serving; unlike uvicorn, do not
        re-raise them afterwards: the shutdown is complete and the caller still has to close
        stores."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in SHUTDOWN_SIGNALS}
        if self._early is not None and self._early.signal is not None:
            # Received while the app was being built: uvicorn starts, then shuts down.
            self.handle_exit(self._early.signal, None)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@contextlib.contextmanager
def loopback_metrics(
    settings: HostSettings, app: object, *, offset: int = 0
) -> Iterator[int | None]:
    """Serve the app's metrics without a token on 127.0.0.1:`metrics.port` + `offset` (the
    worker's index; plain HTTP, never another interface) while the block runs; yields the
    port (None when not configured). A port that cannot be bound (in use) is a
    `SettingsError`: the host exits 2 and says which port, before it serves anything."""
    if settings.metrics.port is None or not isinstance(app, HostApp):
        yield None
        return
    port = settings.metrics.port + offset
    try:
        server, thread = _metrics_server(port, app.metrics.registry, settings.allowed_hosts)
    except OSError as exc:
        raise _metrics_refused(port, offset, exc) from exc
    logger.info("metrics on http://127.0.0.1:%d/metrics", port)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# The names a client that reached 127.0.0.1 by name sends as Host (lower-case, see `host_name`).
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _metrics_refused(port: int, offset: int, exc: OSError) -> SettingsError:
    which = f"metrics.port + {offset}, worker {offset}'s" if offset else "metrics.port"
    return SettingsError(
        f"cannot serve metrics on 127.0.0.1:{port} ({which}): {exc.strerror or exc}"
    )


def _metrics_server(
    port: int, registry: CollectorRegistry, allowed_hosts: Iterable[str]
) -> tuple[WSGIServer, threading.Thread]:
    """prometheus_client's WSGI server on 127.0.0.1, answering `/metrics` only: its own
    answered every path with the metrics and 200, so a readiness probe pointed at this port
    by mistake reported ready while the host's `/readyz` said 503 (a black-box test).

    Only to a loopback Host (`127.0.0.1`, `localhost`, `[::1]`, any port), a name in
    `allowed_hosts`, or no Host at all; any other gets a 400 and nothing of the metrics. The
    port has no token, so a page in a browser on this machine that rebinds its own DNS name
    to 127.0.0.1 (DNS rebinding) could otherwise read it (probe A, session 42): the browser
    sends the page's name as Host. A missing Host is answered: browsers always send one,
    and an HTTP/1.0 scraper may not."""
    metrics = make_wsgi_app(registry)
    answers_to = (_LOOPBACK_HOSTS | {host_name(h) for h in allowed_hosts}) - {""}

    def only_metrics(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # wsgiref joins repeated Host headers with ",": refused whole, as `host_name` would
        # read `127.0.0.1:9100,evil.example` as 127.0.0.1.
        host: str | None = environ.get("HTTP_HOST")
        if host is not None and ("," in host or host_name(host) not in answers_to):
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Bad request: this port answers only to a loopback Host or allowedHosts.\n"]
        if environ.get("PATH_INFO") == "/metrics":
            answer: Iterable[bytes] = metrics(environ, start_response)
            return answer
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"Not found: this port serves /metrics only.\n"]

    server = make_server("127.0.0.1", port, only_metrics, ThreadingWSGIServer, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No request lines on stderr: the host's logs are JSON lines."""


def check_listen_address(host: str, port: int) -> None:
    """`SettingsError` (one line, exit 2) when the host's address cannot be bound (in use,
    not an address of this machine); uvicorn would log it and exit 3. Bound the way uvicorn
    binds (`SO_REUSEADDR`), then released for it."""
    try:
        _probe_bind(host, port)
    except OSError as exc:
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def check_listeners(settings: HostSettings, worker: WorkerSeat | None = None) -> None:
    """`SettingsError` when this process could not bind what it serves on: the host's address
    (a worker's is its seat, bound already) and the loopback metrics port. Called before the
    application factory opens the stores, which migrates a store of an earlier release (that
    release then refuses it): a start refused for a port in use must have changed nothing
    (probe U). `serve` still checks when it binds, for a port taken in between."""
    if worker is None:
        check_listen_address(settings.listen.host, settings.listen.port)
    if settings.metrics.port is not None:
        check_metrics_port(settings.metrics.port, 0 if worker is None else worker.index)


def check_metrics_port(port: int, offset: int) -> None:
    """`SettingsError` when worker `offset`'s loopback metrics port (`port + offset`) cannot be
    bound."""
    try:
        _probe_bind("127.0.0.1", port + offset)
    except OSError as exc:
        raise _metrics_refused(port + offset, offset, exc) from exc


def _probe_bind(host: str, port: int) -> None:
    # SO_REUSEADDR as uvicorn and the metrics server (`http.server`) bind: a port whose last
    # connections wait out TIME_WAIT passes here as it would there.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def serve(
    settings: HostSettings,
    app: object,
    environ: Mapping[str, str],
    *,
    log_config: dict[str, object] | None = None,
    worker: WorkerSeat | None = None,
    early: EarlyStop | None = None,
    on_serving: Callable[[], None] | None = None,
    parse_pool: ParsePool | None = None,
) -> None:
    """Serve in the foreground until SIGINT/SIGTERM, then shut down gracefully (see the
    module docstring) and return. `worker`: serve as one of a supervisor's workers, on its
    own socket on the host's port, ready once every worker serves (`serving.workers`).
    `early`: the signals recorded while the host started (`EarlyStop`). `on_serving` (not
    with `worker`): called once the listener accepts connections. `parse_pool`: the
    driver's, started now (`start_parsers`)."""
    config = uvicorn_config(settings, app, environ, log_config=log_config)
    if parse_pool is not None:
        start_parsers(parse_pool)  # once logging is configured: it may log
    host_app = app if isinstance(app, HostApp) else None
    if worker is None:
        check_listen_address(settings.listen.host, settings.listen.port)
        server = HostServer(config, host_app, on_serving=on_serving, early=early)
        with loopback_metrics(settings, app):
            server.run()
        return
    if host_app is not None:
        host_app.routes.workers_ready = False

    def all_serving() -> None:
        if host_app is not None:
            host_app.routes.workers_ready = True

    # The metrics listener is up before uvicorn starts, so "serving" covers both listeners.
    server = HostServer(
        config, host_app, on_serving=lambda: worker.serving(all_serving), early=early
    )
    with loopback_metrics(settings, app, offset=worker.index):
        server.run(sockets=[worker.sock])


def start_parsers(pool: ParsePool) -> None:
    """Start the parse workers' fork server now, on a thread of its own (about 1 s), so that
    it loads the code on disk at the host's start rather than at the first ingest, which may
    come after a new release was written into the venv (`ingest.fork_server`; probe I,
    session 42). A failure is logged; the first ingest starts it again."""

    def start() -> None:
        try:
            pool.start()
        except Exception as exc:  # logged: the first ingest tries again
            logger.warning("the parse workers could not start: %s", exc)

    threading.Thread(target=start, name="parse-pool-start", daemon=True).start()


def run_server(
    settings: HostSettings,
    driver: Driver | None,
    environ: Mapping[str, str],
    *,
    worker: WorkerSeat | None = None,
    early: EarlyStop | None = None,
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Serve `driver` over HTTPS in the foreground (until SIGINT/SIGTERM); as one of the
    supervisor's workers when `worker` is given; stopping at once for a signal `early`
    recorded during the start; calling `on_serving` once it accepts connections."""
    app = create_app(settings, driver)
    logs = log_config(settings.log_level, worker=None if worker is None else worker.index)
    serve(
        settings,
        app,
        environ,
        log_config=logs,
        worker=worker,
        early=early,
        on_serving=on_serving,
        parse_pool=None if driver is None else driver.parse_pool,
    )

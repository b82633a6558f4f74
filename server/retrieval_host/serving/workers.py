"""Several worker processes serving one listening socket (`listen.workers` > 1).

One Python process runs one request's Python at a time (the GIL): under load a single host
process keeps about 1.3 of 2 cores busy. With `workers: N` the `serve` command becomes a small
supervisor: it reserves the port (refusing one that another host serves: `reserve_port`) and
starts N `serve` processes, each listening on the port with SO_REUSEPORT (each opens its own
stores, caches and model, and runs the application factory). The kernel spreads new
connections over them.

The host is ready when every worker is: each worker tells the supervisor once its listeners
(HTTPS and, when configured, loopback metrics) accept connections, and answers `/readyz` with
503 (check `workers`) until the supervisor has heard from all of them. Otherwise the first
worker up would report the host ready while the kernel could not yet hand a connection, nor a
metrics scrape, to the others.

The supervisor forwards SIGTERM/SIGINT/SIGHUP (as SIGTERM) to every worker (each shuts down
gracefully, as a single host does) and exits 0 once all have stopped: exited 0, or ended by
that SIGTERM while still loading its modules (before it could take the signal: nothing of it
was open). A stop while the workers start is one too (each finishes the step under way,
`server.EarlyStop`): it read as a worker that died, exit 1 with no line saying why (probe O,
session 40). If a worker exits on its own, the supervisor stops the others and exits 1, so
the service manager restarts the whole host (a host with a missing worker would silently
serve at a fraction of its capacity). Workers run in their own session: a terminal's Ctrl-C
reaches only the supervisor, which forwards it once. A second SIGINT or SIGTERM to the
supervisor does not wait for the workers: it kills them (SIGKILL) and exits 130 or 143 at once
(`server.exit_at_once`). A worker itself never takes a second signal so: under systemd's
default `KillMode` each worker gets the service's SIGTERM as well as the forwarded one.

What is per worker: `limits.maxConcurrency` (the host accepts up to N times as many requests at
once), the grant cache, the embedding model, and metrics: `GET /metrics`
answers with the counters of the worker that took the connection, and the loopback metrics
port of worker i is `metrics.port + i` (scrape all N). The SQLite store's index is shared:
each worker maps the same index snapshot file (`adapters.sqlite.snapshot`), so the page cache
holds one copy; only what a worker loads from SQLite after its start is its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final

from retrieval_host.serving.server import (
    FORCING_SIGNALS,
    EarlyStop,
    check_listen_address,
    check_metrics_port,
    exit_at_once,
)
from retrieval_host.settings import HostSettings, SettingsError

logger = logging.getLogger("retrieval_host.workers")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT (not listening yet).

    Every worker binds its own such socket on the one port and listens on it: the kernel then
    spreads new connections over the workers by a hash of the connection. (One socket shared by
    all workers would not: the first worker to wake accepts every pending connection, so a
    burst of connections could all land on one worker.) Only processes of the same user can
    join the port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def port_lock(host: str, port: int) -> socket.socket | None:
    """A lock on (host, port) among supervisors, held for the supervisor's life: a Unix
    socket bound in the abstract namespace (released by the kernel when the process ends,
    however it ends). `reserve_port`'s bind checks leave two gaps that it closes: two
    supervisors started at the same moment both passing the check before either binds, and
    the TIME_WAIT fallback, where the reservation shares the port with another that has
    SO_REUSEADDR too. None for port 0 (a port of the kernel's choice is no one else's)."""
    if port == 0:
        return None
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0retrieval-host:{_lock_address(host, port)}:{port}")
    except OSError as exc:
        lock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SettingsError(
                f"cannot listen on {host}:{port}: another retrieval-host with workers is "
                "starting or serving there"
            ) from None
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return lock


def _lock_address(host: str, port: int) -> str:
    """The address `reserve_port` binds for `host`, so that two spellings of one address
    (`localhost`, `127.0.0.1`) take one lock; `host` itself when it does not resolve (the
    bind then says so)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        found = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return host
    return str(found[0][4][0]) if found else host


def reserve_port(host: str, port: int) -> socket.socket:
    """The supervisor's hold on (host, port), bound with SO_REUSEPORT for its workers to join
    (never listening). `SettingsError` (one line, exit 2) when the address cannot be bound:
    in use, not an address of this machine, a name that does not resolve.

    SO_REUSEPORT lets any process of the same user join the port, so a second host started on
    the port of a running one joined it without an error, and the kernel split connections
    between two configurations and two stores (a black-box test). Hence the checks:

    - First a bind without SO_REUSEPORT (`check_listen_address`, a single-process host's
      check), which fails while any socket listens there: a running host's workers, or a
      single-process host.
    - The socket held here has no SO_REUSEADDR: until this host's own workers listen, the
      same check by another host fails on it too (SO_REUSEADDR lets a socket share a port
      only with sockets that have it as well), while the workers, which have SO_REUSEPORT
      like it, join. Unless a connection of an earlier host without SO_REUSEPORT (a
      single-process one) still waits out its TIME_WAIT on the port: that blocks such a bind
      for up to a minute, so the socket then takes SO_REUSEADDR as the workers' have.
    """
    check_listen_address(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    except BaseException:
        sock.close()
        raise
    return sock


# One byte on a worker's channel: from the worker, "my listeners accept"; from the supervisor,
# "every worker's do".
SERVING: Final = b"1"


def worker_command(config_file: Path, index: int, port: int, channel: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "retrieval_host.serving.cli",
        "serve",
        "--config",
        str(config_file),
        "--worker",
        f"{index}:{port}:{channel}",
    ]


def supervise(
    config_file: Path,
    settings: HostSettings,
    environ: Mapping[str, str],
    *,
    early: EarlyStop | None = None,
) -> int:
    """Run `settings.listen.workers` workers on one socket until they stop; the exit code.
    A signal `early` recorded while the supervisor started starts no worker (exit 0)."""
    metrics_port = settings.metrics.port
    if metrics_port is not None and metrics_port + settings.listen.workers - 1 > 65535:
        raise SettingsError("metrics.port + listen.workers - 1 must be a port number")
    if metrics_port is not None:
        # Every worker's, before any starts: worker 0 opens (and migrates) the stores, so a
        # refusal by a later worker would come after an earlier release's stores changed.
        for index in range(settings.listen.workers):
            check_metrics_port(metrics_port, index)
    # Held (bound, never listening: it takes no connections) until the workers have stopped,
    # so the port, also a port 0 chosen here, stays the host's.
    lock = port_lock(settings.listen.host, settings.listen.port)
    try:
        reserved = reserve_port(settings.listen.host, settings.listen.port)
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    host, port = reserved.getsockname()[:2]
    # Not "serving" yet: that is said once every worker's listeners accept (`all ... serving`).
    logger.info("starting %d worker processes on %s:%d", settings.listen.workers, host, port)
    workers: list[subprocess.Popen[bytes]] = []
    stopping = False
    told: set[int] = set()

    def stop(worker: subprocess.Popen[bytes]) -> None:
        # Once per worker, and without `poll()`/`send_signal()`: they reap a worker that has
        # exited, which `_wait`'s waitpid would then never see. Until `_wait` has reaped it
        # its pid stays this worker's (a zombie ignores the signal); reaped, it may be gone.
        if worker.returncode is None and worker.pid not in told:
            told.add(worker.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)

    def forward(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            stop(worker)

    signalled = None if early is None else early.signal

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal signalled
        if signalled is None:
            signalled = sig
            logger.info(
                "%s: stopping the workers (SIGINT or SIGTERM again kills them at once)",
                signal.Signals(sig).name,
            )
        elif sig in FORCING_SIGNALS:
            _kill(workers)
            exit_at_once(sig, "the workers to stop (killed)")
        forward(sig, frame)

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    if early is not None and early.signal is not None:
        logger.info("received %s while starting: no worker started", early.name)
        forward(early.signal, None)
    channels: list[socket.socket] = []
    try:
        for index in range(settings.listen.workers):
            if stopping:
                break  # a stop while the workers start: none more
            ours, theirs = socket.socketpair()
            channels.append(ours)
            with theirs:
                workers.append(
                    subprocess.Popen(  # noqa: S603 - this interpreter, this module, our arguments
                        worker_command(config_file, index, port, theirs.fileno()),
                        env=dict(environ),
                        start_new_session=True,
                        pass_fds=(theirs.fileno(),),
                    )
                )
            if stopping:  # the signal came while this worker was being started
                stop(workers[-1])
        threading.Thread(
            target=_ready_when_all_serve, args=(channels,), name="workers-ready", daemon=True
        ).start()
        return _wait(workers, lambda: stopping, forward)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for channel in channels:
            channel.close()
        reserved.close()
        if lock is not None:
            lock.close()


def _kill(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every worker not yet reaped, then reap them: nothing of the host is left
    running once the supervisor has exited."""
    for worker in workers:
        if worker.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
    for worker in workers:
        if worker.returncode is None:
            with contextlib.suppress(ChildProcessError):  # reaped by `_wait` just before
                os.waitpid(worker.pid, 0)


def _ready_when_all_serve(channels: Sequence[socket.socket]) -> None:
    """Wait until every worker says its listeners accept, then tell them all (nothing if one
    exits first: the supervisor then stops the host)."""
    try:
        for channel in channels:
            if channel.recv(1) != SERVING:
                return
        logger.info("all %d workers are serving", len(channels))
        for channel in channels:
            channel.sendall(SERVING)
    except OSError:
        return  # the supervisor closed the channels: the host is stopping


def _wait(
    workers: Sequence[subprocess.Popen[bytes]],
    stopping: Callable[[], bool],
    stop_all: Callable[[int, FrameType | None], None],
) -> int:
    """Reap workers as they exit; the first one to exit unasked stops the rest. The exit code:
    0, or 2 when that first worker refused its configuration (exit 2, its one line already on
    stderr: an ACL file or store it cannot open), else 1. Once stopping, a worker ended by the
    SIGTERM forwarded to it (-15: it was still loading its modules, with nothing open) has
    stopped as asked, as one that exits 0."""
    codes: dict[int, int] = {}
    by_pid = {worker.pid: worker for worker in workers}
    failed = False
    first: int | None = None  # the exit code of the first worker that exited unasked
    while len(codes) < len(workers):
        pid, status = os.waitpid(-1, 0)  # retried after a signal handler (PEP 475)
        worker = by_pid.get(pid)
        if worker is None:
            continue
        worker.returncode = code = os.waitstatus_to_exitcode(status)
        codes[pid] = code
        if not stopping():
            if code == 2:  # its one `retrieval-host: ...` line is on stderr already
                logger.error("worker %d refused to start (exit 2); stopping the others", pid)
            else:
                logger.error("worker %d exited with %d; stopping the others", pid, code)
            failed = True
            first = code if first is None else first
            stop_all(signal.SIGTERM, None)
        elif code == -signal.SIGTERM:
            logger.info("worker %d stopped while it was loading (SIGTERM)", pid)
        elif code != 0:
            logger.error("worker %d exited with %d while stopping", pid, code)
            failed = True
    if first == 2:
        return 2
    return 1 if failed else 0


@dataclass(frozen=True)
class WorkerSeat:
    """What a worker gets from its supervisor: its index, its own socket on the host's port
    (bound, not listening yet) and the channel on which readiness is exchanged."""

    index: int
    sock: socket.socket
    channel: socket.socket

    def serving(self, on_all_serving: Callable[[], None]) -> None:
        """Tell the supervisor this worker's listeners accept connections; call
        `on_all_serving` (on another thread) once every worker's do."""
        self.channel.sendall(SERVING)
        threading.Thread(
            target=self._await_all, args=(on_all_serving,), name="workers-ready", daemon=True
        ).start()

    def _await_all(self, on_all_serving: Callable[[], None]) -> None:
        try:
            answer = self.channel.recv(1)
        except OSError:
            return
        if answer == SERVING:
            on_all_serving()


def worker_seat(host: str, spec: str) -> WorkerSeat:
    """`INDEX:PORT:CHANNEL` from the supervisor: the worker's index, its own socket on the
    port, and the file descriptor of its readiness channel.

    The worker also asks the kernel for SIGTERM when its supervisor dies (it runs in its own
    session, so nothing else would stop it if the supervisor were killed outright).
    """
    index, port, channel = spec.split(":")
    supervisor = os.getppid()
    _terminate_with_parent()
    if os.getppid() != supervisor:  # the supervisor died before the request took effect
        raise SystemExit(1)
    return WorkerSeat(
        int(index), reuse_port_socket(host, int(port)), socket.socket(fileno=int(channel))
    )


def _terminate_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGTERM) on Linux; nothing elsewhere."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - Linux only here
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
        logger.warning(
            "could not ask to be stopped with the supervisor: errno %d", ctypes.get_errno()
        )

"""`listen.workers`: one `retrieval-host serve` as a supervisor of worker processes that
accept on one listening socket, share the store, and stop together."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import pytest

from retrieval_host.serving.workers import port_lock, reserve_port, reuse_port_socket
from retrieval_host.settings import SettingsError
from tests.support.host import wait_until
from tests.support.observability import (
    CORPUS,
    METRICS_SCRAPER,
    HostProcess,
    host_process,
    parse_metrics,
    total,
)
from tests.support.ports import free_ports


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _served_healthz(host: HostProcess, worker: int) -> float:
    assert host.metrics_port is not None
    text = httpx.get(f"http://127.0.0.1:{host.metrics_port + worker}/metrics", timeout=10).text
    return total(parse_metrics(text), "retrieval_host_http_requests_total", route="/healthz")


def test_two_workers_share_the_port_and_the_index_and_stop_together(tmp_path: Path) -> None:
    # `auditor` is granted a provider the host lacks: worker 0 says so before it serves.
    subjects: dict[str, list[str]] = {"writer": [], "auditor": ["absent"], METRICS_SCRAPER: []}
    with host_process(tmp_path / "host", subjects=subjects, metrics_port=True, workers=2) as host:
        workers = _children(host.process.pid)
        assert len(workers) == 2, host.log_text()[-3000:]
        with host.client("writer") as writer:
            indexed = writer.post(
                "/v1/retrieval/index",
                json={
                    "corpus": CORPUS,
                    "source": {"id": "shared-notes", "revision": "r1"},
                    "chunks": [{"id": "n-1", "text": "Both workers read one store."}],
                },
            )
            assert indexed.status_code == 200, indexed.text
        before = [_served_healthz(host, i) for i in range(2)]
        # Fresh connections, each accepted by whichever worker the kernel picks: both serve,
        # and every search (on either worker) sees the passage indexed through one of them.
        for _ in range(40):
            with host.client("writer") as client:
                client.timeout = httpx.Timeout(10)  # a stuck worker fails the test, soon
                assert client.get("/healthz").status_code == 200
                found = client.post(
                    "/v1/retrieval/search", json={"corpus": CORPUS, "query": "workers store"}
                )
                assert found.status_code == 200, found.text
                assert [h["chunkId"] for h in found.json()["hits"]] == ["n-1"]
        served = [_served_healthz(host, i) - before[i] for i in range(2)]
        assert sum(served) == 40
        assert min(served) > 0, served
        # SIGHUP (a closed terminal, a service manager's "reload") stops it as SIGTERM does:
        # forwarded to each worker, which shuts down gracefully.
        code, _ = host.terminate(sig=signal.SIGHUP)
        assert code == 0, host.log_text()[-4000:]
        assert not any(_alive(pid) for pid in workers)
        received = [r for r in host.log_records() if "received" in r["message"]]
        assert [r["message"] for r in received] == ["received SIGTERM"] * 2, received
        # Each worker's lines say which (a black-box test could not tell them apart); the
        # supervisor's own lines name none.
        assert sorted(r["worker"] for r in received) == [0, 1]
        access = [r for r in host.log_records() if r["logger"] == "retrieval_host.access"]
        assert access and {r["worker"] for r in access} == {0, 1}
        # Every worker line's `worker` is its index, also those logged while its stores opened
        # (probe D, session 37: those carried the supervisor's "0:PORT:FD" spec, a string).
        assert {r["worker"] for r in host.log_records() if "worker" in r} == {0, 1}
        [idle] = [r for r in host.log_records() if "'absent'" in r["message"]]
        assert idle["worker"] == 0
        messages = [r["message"] for r in host.log_records() if "worker" not in r]
        assert any(m.startswith("starting 2 worker processes on ") for m in messages), messages


def test_a_single_host_stops_on_sighup_as_on_sigterm(tmp_path: Path) -> None:
    with host_process(tmp_path / "host", subjects={"writer": []}) as host:
        code, _ = host.terminate(sig=signal.SIGHUP)
        assert code == 0, host.log_text()[-4000:]
        messages = [r["message"] for r in host.log_records()]
        assert "received SIGHUP" in messages, messages
        assert "Traceback" not in host.log_text()


# An application factory that holds the first worker to call it until the test says so: that
# worker has no listener yet (neither HTTPS nor metrics) while the other one serves.
HELD_APP = """
import os
import time
from pathlib import Path

from retrieval_host.example_acl import create_driver as example_driver


def create_driver(settings, environ):
    gate = Path(environ["TEST_GATE_DIR"])
    try:
        os.close(os.open(gate / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return example_driver(settings, environ)
    deadline = time.monotonic() + 120
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return example_driver(settings, environ)
"""


def _readiness(host: HostProcess) -> httpx.Response:
    with host.client() as client:
        return client.get("/readyz", timeout=10)


def test_the_host_is_ready_only_once_every_worker_accepts_on_both_listeners(
    tmp_path: Path,
) -> None:
    directory, gate = tmp_path / "host", tmp_path / "gate"
    directory.mkdir(mode=0o700)
    gate.mkdir()
    (directory / "held_app.py").write_text(HELD_APP)
    with host_process(
        directory,
        subjects={"writer": []},
        metrics_port=True,
        workers=2,
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate)},
        wait_ready=False,
    ) as host:
        assert host.metrics_port is not None
        wait_until(lambda: (gate / "held").exists(), timeout=90, what="a worker to be held")

        def one_serves() -> bool:
            try:
                with host.client() as client:
                    return client.get("/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(one_serves, timeout=90, what="the other worker to serve")
        # Every connection reaches the one worker listening: the host is not ready yet.
        not_ready = _readiness(host)
        assert not_ready.status_code == 503, not_ready.text
        assert not_ready.json()["checks"]["workers"] is False
        (gate / "release").touch()
        wait_until(
            lambda: _readiness(host).status_code == 200, timeout=90, what="the host to be ready"
        )
        # Ready means every worker's listeners accept: both metrics ports answer at once.
        for worker in range(2):
            url = f"http://127.0.0.1:{host.metrics_port + worker}/metrics"
            assert httpx.get(url, timeout=10).status_code == 200
        assert _readiness(host).json()["checks"]["workers"] is True
        code, _ = host.terminate()
        assert code == 0, host.log_text()[-4000:]


def test_a_worker_whose_metrics_port_is_taken_stops_the_host_before_it_starts(
    tmp_path: Path,
) -> None:
    metrics_port = free_ports(2)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", metrics_port + 1))
        squatter.listen()
        with host_process(
            tmp_path / "host",
            subjects={"writer": []},
            metrics_port=metrics_port,
            workers=2,
            wait_ready=False,
        ) as host:
            # Refused before any worker starts (worker 0 would open and migrate the stores).
            assert host.process.wait(timeout=90) == 2
            log = host.log_text()
    taken = f"127.0.0.1:{metrics_port + 1} (metrics.port + 1, worker 1's): Address already in use"
    assert f"retrieval-host: cannot serve metrics on {taken}" in log, log[-4000:]
    assert "worker processes" not in log and "exited with" not in log
    assert "Traceback" not in log


def test_a_single_host_whose_metrics_port_is_taken_exits_2(tmp_path: Path) -> None:
    metrics_port = free_ports(1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", metrics_port))
        squatter.listen()
        with host_process(
            tmp_path / "host", subjects={"writer": []}, metrics_port=metrics_port, wait_ready=False
        ) as host:
            assert host.process.wait(timeout=90) == 2
            log = host.log_text()
    assert f"cannot serve metrics on 127.0.0.1:{metrics_port} (metrics.port)" in log, log[-4000:]
    assert "Traceback" not in log


def test_a_worker_that_dies_stops_the_host_with_an_error(tmp_path: Path) -> None:
    with host_process(tmp_path / "host", subjects={"writer": []}, workers=2) as host:
        workers = _children(host.process.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        assert host.process.wait(timeout=60) == 1
        wait_until(lambda: not _alive(workers[1]), timeout=30, what="the other worker to stop")
        assert "stopping the others" in host.log_text()


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    with host_process(tmp_path / "host", subjects={"writer": []}, workers=2) as host:
        workers = _children(host.process.pid)
        assert len(workers) == 2
        host.process.kill()  # no signal to forward: the kernel tells the workers
        host.process.wait(timeout=30)
        wait_until(
            lambda: not any(_alive(pid) for pid in workers),
            timeout=60,
            what="the workers to stop with their supervisor",
        )


def test_a_port_held_or_served_by_a_host_with_workers_cannot_be_reserved_again() -> None:
    # SO_REUSEPORT lets any process of the same user join the port: a second host with workers
    # joined a running one's, and the kernel split the connections between two stores.
    with reserve_port("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        in_use = f"cannot listen on 127.0.0.1:{port}: Address already in use"
        # The first host's workers have not started listening yet: its hold alone refuses.
        with pytest.raises(SettingsError, match=in_use):
            reserve_port("127.0.0.1", port)
        with reuse_port_socket("127.0.0.1", port) as worker:  # its own workers still join
            worker.listen()
            with pytest.raises(SettingsError, match=in_use):
                reserve_port("127.0.0.1", port)
    with reuse_port_socket("127.0.0.1", 0) as worker:  # a worker whose supervisor is gone
        worker.listen()
        port = worker.getsockname()[1]
        with pytest.raises(SettingsError, match=f"127.0.0.1:{port}: Address already in use"):
            reserve_port("127.0.0.1", port)


def test_a_port_a_single_process_host_just_left_can_be_reserved_for_workers() -> None:
    # Its connections closed by the server wait out TIME_WAIT on the port, without
    # SO_REUSEPORT: a host restarted with workers must not be refused for a minute.
    with socket.socket() as single:
        single.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        single.bind(("127.0.0.1", 0))
        single.listen()
        port = single.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = single.accept()
            served.close()  # the server closes first: its side waits in TIME_WAIT
            assert client.recv(1) == b""
    with reserve_port("127.0.0.1", port), reuse_port_socket("127.0.0.1", port) as worker:
        worker.listen()


# Every worker waits in the application factory until the test releases it: the host holds
# its port while nothing listens on it yet.
GATED_APP = """
import os
import time
from pathlib import Path

from retrieval_host.example_acl import create_driver as example_driver


def create_driver(settings, environ):
    gate = Path(environ["TEST_GATE_DIR"])
    (gate / f"worker-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return example_driver(settings, environ)
"""


def test_a_second_host_with_workers_refuses_the_port_of_a_running_one(tmp_path: Path) -> None:
    directory, gate = tmp_path / "first", tmp_path / "gate"
    directory.mkdir(mode=0o700)
    gate.mkdir()
    (directory / "gated_app.py").write_text(GATED_APP)
    with host_process(
        directory,
        subjects={"writer": []},
        workers=2,
        application="gated_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate)},
        wait_ready=False,
    ) as first:
        wait_until(
            lambda: len(list(gate.glob("worker-*"))) == 2,
            timeout=90,
            what="both workers to be held before they listen",
        )
        for phase in ("starting", "serving"):
            with host_process(
                tmp_path / f"second-while-{phase}",
                subjects={"writer": []},
                workers=2,
                environ={"RETRIEVAL_HOST_LISTEN__PORT": str(first.port)},
                wait_ready=False,
            ) as second:
                assert second.process.wait(timeout=90) == 2, second.log_text()[-3000:]
                log = second.log_text()
            in_use = (
                f"retrieval-host: cannot listen on 127.0.0.1:{first.port}: "
                "another retrieval-host with workers is starting or serving there"
            )
            assert in_use in log, log[-3000:]
            assert "Traceback" not in log and "worker processes" not in log
            if phase == "starting":
                (gate / "release").touch()
                wait_until(lambda: _ready(first), timeout=90, what="the first host to serve")
        assert _readiness(first).status_code == 200
        code, _ = first.terminate()
        assert code == 0, first.log_text()[-4000:]


def _ready(host: HostProcess) -> bool:
    try:
        return _readiness(host).status_code == 200
    except httpx.TransportError:
        return False


def test_two_supervisors_cannot_hold_the_lock_of_one_address() -> None:
    # The bind checks of `reserve_port` pass for both of two supervisors started at the same
    # moment (and in its TIME_WAIT fallback): the lock is what one of them then lacks.
    port = free_ports(1)
    first = port_lock("127.0.0.1", port)
    assert first is not None
    try:
        with pytest.raises(SettingsError, match="another retrieval-host with workers"):
            port_lock("127.0.0.1", port)
        # Another spelling of the address (`reserve_port` binds what it resolves to).
        with pytest.raises(SettingsError, match="another retrieval-host with workers"):
            port_lock("localhost", port)
        other = port_lock("127.0.0.1", port + 1 if port < 65535 else port - 1)
        assert other is not None
        other.close()
    finally:
        first.close()
    again = port_lock("127.0.0.1", port)  # released with its holder
    assert again is not None
    again.close()
    assert port_lock("127.0.0.1", 0) is None

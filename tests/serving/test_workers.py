"""`listen.workers`: one `retrieval-host serve` as a supervisor of worker processes that
accept on one listening socket, share the store, and stop together."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx

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
    subjects: dict[str, list[str]] = {"writer": [], METRICS_SCRAPER: []}
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
        code, _ = host.terminate()
        assert code == 0, host.log_text()[-4000:]
        assert not any(_alive(pid) for pid in workers)


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


def test_a_worker_whose_metrics_port_is_taken_stops_the_host_saying_which(
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
            # The worker refused its configuration (exit 2): so does the host, as one would.
            assert host.process.wait(timeout=90) == 2
            log = host.log_text()
    taken = f"127.0.0.1:{metrics_port + 1} (metrics.port + 1, worker 1's): Address already in use"
    assert f"retrieval-host: cannot serve metrics on {taken}" in log, log[-4000:]
    assert "worker" in log and "exited with 2; stopping the others" in log
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

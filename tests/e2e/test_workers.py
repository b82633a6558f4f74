"""`listen.workers`: one `retrieval-host serve` as a supervisor of worker processes that
accept on one listening socket, share the store, and stop together."""

from __future__ import annotations

import os
import signal
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

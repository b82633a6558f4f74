"""Benchmark (not a test): a real host under hostile uploads (issue 13, defect 2).

    python bench/hostile_ingest.py [--inputs 500] [--concurrency 8]

Prepares a quickstart state in a private directory, starts `retrieval-host serve` on it as a
subprocess (HTTPS on 127.0.0.1, loopback metrics, `maxConcurrency` = `--concurrency`,
`ingestDeadlineS` 5) and prints:

1. time to refusal of the 5.6 KB operator bomb (500,000 `(x) Tj`), status and code;
2. slot release after a disconnect: a client uploads a PDF that is under every static bound but
   parses for ~25 s, hangs up once the parse runs; time until `concurrency_in_use` is 0;
3. search availability during 8 abandoned bombs (the same slow PDF, each client hanging up
   after 1 s): searches answered / 503 / other and their latency, while the bombs are connected
   and after they hang up, and the time from the hang-up to the first slot-free moment;
4. the host's RSS before and after `--inputs` hostile inputs (operator bombs, heading floods,
   mutated PDFs, random mail bodies that run into the deadline), the ratio, and the parse
   workers' RSS. Exits 1 when the ratio exceeds 1.3.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

if __package__ in (None, ""):  # run as `python bench/hostile_ingest.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench._common import REPO
from tests.support import ingest_documents as docs

RSS_RATIO_LIMIT = 1.3
SLOW_PDF = (20, 45_000)  # pages, `(x) Tj` per page: under every bound, ~25 s to extract
CLI = [sys.executable, "-m", "retrieval_host.serving.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (parse workers are children of the fork server)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    parents = [tuple(int(v) for v in line.split()) for line in out.stdout.splitlines()]
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        below = [child for child, parent in parents if parent == current]
        found += below
        frontier += below
    return found


class Host:
    def __init__(self, state: Path, concurrency: int) -> None:
        self.state = state
        self.port = free_port()
        self.metrics_port = free_port()
        subprocess.run(
            [*CLI, "quickstart", "--state-dir", str(state), "--port", str(self.port), "--no-serve"],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
        env = {
            **os.environ,
            "RETRIEVAL_HOST_LIMITS__MAX_CONCURRENCY": str(concurrency),
            "RETRIEVAL_HOST_LIMITS__INGEST_DEADLINE_S": "5",
            "RETRIEVAL_HOST_METRICS__PORT": str(self.metrics_port),
            "RETRIEVAL_HOST_LOG_LEVEL": "warning",
        }
        self.process = subprocess.Popen(
            [*CLI, "serve", "--config", str(state / "host.json")],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.token = (state / "token").read_text().strip()
        self.tls = ssl.create_default_context(cafile=str(state / "ca.pem"))
        self.client = httpx.Client(
            base_url=f"https://127.0.0.1:{self.port}",
            verify=self.tls,
            timeout=60,
            headers={"Authorization": f"Bearer {self.token}"},
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("the host did not become ready")
            time.sleep(0.05)

    def in_use(self) -> int:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("retrieval_host_concurrency_in_use"):
                return int(float(line.split()[-1]))
        raise RuntimeError("no concurrency gauge")

    def ingest(self, source_id: str, media_type: str, data: bytes) -> httpx.Response:
        return self.client.post(
            "/v1/retrieval/ingest",
            params={"corpus": "library", "sourceId": source_id},
            content=data,
            headers={"Content-Type": media_type},
        )

    def search(self) -> tuple[int, float]:
        started = time.monotonic()
        try:
            status = self.client.post(
                "/v1/retrieval/search", json={"corpus": "library", "query": "rotate a token"}
            ).status_code
        except httpx.TransportError:
            status = 0
        return status, time.monotonic() - started

    def abandoned_upload(self, data: bytes) -> socket.socket:
        """Send an upload on a raw TLS connection and return it unread (close = hang up)."""
        plain = socket.create_connection(("127.0.0.1", self.port))
        conn = self.tls.wrap_socket(plain, server_hostname="127.0.0.1")
        query = urlencode({"corpus": "library", "sourceId": "abandoned"})
        head = (
            f"POST /v1/retrieval/ingest?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {self.token}\r\nContent-Type: application/pdf\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        conn.sendall(head.encode() + data)
        return conn

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise SystemExit("timed out")
        time.sleep(0.01)
    return time.monotonic() - started


def refusal(host: Host) -> None:
    bomb = docs.operator_bomb_pdf(500_000)
    started = time.monotonic()
    response = host.ingest("bomb", "application/pdf", bomb)
    elapsed = time.monotonic() - started
    body = response.json()
    print(
        f"1. operator bomb ({len(bomb)} bytes, 500,000 operators): {response.status_code} "
        f"{body.get('code')}/{body.get('reason')} in {elapsed:.2f} s"
    )


def slot_release(host: Host, slow: bytes) -> None:
    conn = host.abandoned_upload(slow)
    wait_for(lambda: host.in_use() == 1)
    time.sleep(0.5)  # the parse is under way (it takes ~25 s)
    conn.close()
    released = wait_for(lambda: host.in_use() == 0)
    print(f"2. slot release after a disconnect during a parse: {released * 1000:.0f} ms")


def availability(host: Host, slow: bytes, bombs: int) -> None:
    stop = threading.Event()
    phase = ["connected"]
    results: dict[str, list[tuple[int, float]]] = {"connected": [], "after": []}

    def searching() -> None:
        while not stop.is_set():
            status, latency = host.search()
            results[phase[0]].append((status, latency))

    searcher = threading.Thread(target=searching)
    connections = [host.abandoned_upload(slow) for _ in range(bombs)]
    searcher.start()
    time.sleep(1.0)  # the clients hang up after 1 s, as in the report
    held = host.in_use()
    for conn in connections:
        conn.close()
    hung_up = time.monotonic()
    phase[0] = "after"
    freed = wait_for(lambda: host.in_use() <= 1)  # only the searcher's own request left
    time.sleep(max(0.0, 5.0 - (time.monotonic() - hung_up)))
    stop.set()
    searcher.join()
    print(
        f"3. search availability with {bombs} abandoned bombs (hang-up after 1 s; "
        f"{held} slots held just before it):"
    )
    for name, rows in results.items():
        ok = [lat for status, lat in rows if status == 200]
        busy = sum(1 for status, _ in rows if status == 503)
        other = len(rows) - len(ok) - busy
        p50 = sorted(ok)[len(ok) // 2] * 1000 if ok else float("nan")
        worst = max(ok) * 1000 if ok else float("nan")
        print(
            f"   {name:>9}: {len(ok)} answered 200, {busy} answered 503, {other} other; "
            f"latency p50 {p50:.0f} ms, max {worst:.0f} ms"
        )
    print(f"   slots free {freed * 1000:.0f} ms after the hang-up")


def hostile_inputs(count: int) -> list[tuple[str, bytes]]:
    rng = random.Random(11)
    base = docs.text_pdf([["Mooring", "Fees are paid at noon."]] * 2)
    made: list[tuple[str, bytes]] = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            made.append(("application/pdf", docs.operator_bomb_pdf(rng.randint(150_000, 500_000))))
        elif kind == 1:
            made.append(("text/markdown", b"# a\n" * rng.randint(5_000, 20_000)))
        elif kind == 2:
            data = bytearray(base)
            for _ in range(rng.randint(1, 10)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            made.append(("application/pdf", bytes(data)))
        elif kind == 3 and i % 50 == 3:
            made.append(("message/rfc822", docs.random_body_message(60_000, seed=i)))
        else:
            made.append(("message/rfc822", docs.many_parts_message(rng.randint(200, 990))))
    return made


def memory(host: Host, count: int) -> bool:
    before = rss_kib(host.process.pid)
    outcomes: dict[str, int] = {}

    def send(item: tuple[int, tuple[str, bytes]]) -> None:
        index, (media_type, data) = item
        response = host.ingest(f"hostile-{index % 7}", media_type, data)
        key = f"{response.status_code} {response.json().get('code', 'indexed')}"
        outcomes[key] = outcomes.get(key, 0) + 1

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(send, enumerate(hostile_inputs(count))))
    elapsed = time.monotonic() - started
    after = rss_kib(host.process.pid)
    workers = sum(rss_kib(pid) for pid in descendants(host.process.pid))
    ratio = after / before
    print(f"4. {count} hostile inputs in {elapsed:.0f} s: {dict(sorted(outcomes.items()))}")
    print(
        f"   host RSS before {before / 1024:.0f} MiB, after {after / 1024:.0f} MiB: "
        f"ratio {ratio:.2f} (limit {RSS_RATIO_LIMIT}); fork server and parse workers now "
        f"{workers / 1024:.0f} MiB"
    )
    return ratio <= RSS_RATIO_LIMIT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    slow = docs.operator_heavy_pdf(*SLOW_PDF)
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as directory:
        host = Host(Path(directory) / "state", args.concurrency)
        try:
            print(f"host pid {host.process.pid}, maxConcurrency {args.concurrency}")
            host.search()
            refusal(host)
            slot_release(host, slow)
            availability(host, slow, 8)
            ok = memory(host, args.inputs)
        finally:
            host.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

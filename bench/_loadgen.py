"""A small closed-loop HTTP/1.1 load generator for the HTTP benchmark (loopback only).

`clients` keep-alive connections (TLS or plain), each sending one request, reading the whole
response, then sending the next, for a fixed time. Requests are prepared bytes, so the client
costs little CPU next to the servers it measures (both share this machine's cores). The
responses are parsed just enough to frame them (Content-Length or chunked).
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import uvloop


@dataclass(frozen=True)
class Target:
    """Where to send, and the requests to cycle through (complete HTTP/1.1 messages)."""

    name: str
    port: int
    requests: Sequence[bytes]
    tls: ssl.SSLContext | None = None
    host: str = "127.0.0.1"
    # False: client n sends requests n, n+1, n+2, ... (at any moment the clients hold
    # consecutive requests, e.g. 16 different grants), so each request is sent by up to
    # `clients` clients in turn. True: client n sends n, n + clients, n + 2 x clients, ...: no
    # request is sent twice until the list wraps (unique queries must not hit a cache).
    disjoint: bool = False


@dataclass
class LoadResult:
    """What one timed run saw."""

    name: str
    seconds: float
    ok: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    response_bytes: int = 0

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1e3

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies) * 1e3 if self.latencies else float("nan")


def request(
    method: str, path: str, body: bytes, headers: dict[str, str], host: str = "127.0.0.1"
) -> bytes:
    """A complete HTTP/1.1 request message with a Content-Length body."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one response (Content-Length or chunked framing)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = -1
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        lowered = name.strip().lower()
        if lowered == "content-length":
            length = int(value.strip())
        elif lowered == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return status, (await reader.readexactly(length)) if length > 0 else b""


async def fetch(target: Target, message: bytes) -> tuple[int, bytes]:
    """One request on a fresh connection (for checks before the timed runs)."""
    reader, writer = await asyncio.open_connection(
        target.host,
        target.port,
        ssl=target.tls,
        server_hostname=target.host if target.tls else None,
    )
    try:
        writer.write(message)
        return await read_response(reader)
    finally:
        writer.close()


async def _client(
    target: Target,
    offset: int,
    step: int,
    start: asyncio.Event,
    ready: list[int],
    warm_until: list[float],
    stop_at: list[float],
    result: LoadResult,
) -> None:
    reader, writer = await asyncio.open_connection(
        target.host,
        target.port,
        ssl=target.tls,
        server_hostname=target.host if target.tls else None,
    )
    ready.append(offset)
    await start.wait()
    requests = target.requests
    count = len(requests)
    i = offset
    try:
        while True:
            sent = time.perf_counter()
            if sent >= stop_at[0]:
                return
            writer.write(requests[i % count])
            i += step
            status, body = await read_response(reader)
            done = time.perf_counter()
            if sent < warm_until[0]:
                continue  # the warm-up is not counted
            if done > stop_at[0]:
                return  # finished after the window: not counted either
            result.statuses[status] = result.statuses.get(status, 0) + 1
            if status == 200:
                result.ok += 1
                result.response_bytes += len(body)
                result.latencies.append(done - sent)
            else:
                result.errors += 1
    finally:
        writer.close()


async def _run(target: Target, clients: int, seconds: float, warmup: float) -> LoadResult:
    result = LoadResult(target.name, seconds)
    start = asyncio.Event()
    ready: list[int] = []
    warm_until = [0.0]
    stop_at = [0.0]
    step = clients if target.disjoint else 1
    tasks = [
        asyncio.create_task(_client(target, n, step, start, ready, warm_until, stop_at, result))
        for n in range(clients)
    ]
    while len(ready) < clients:
        if any(t.done() for t in tasks):
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise RuntimeError(f"{target.name}: a client could not connect") from (
                        t.exception()
                    )
        await asyncio.sleep(0.005)
    now = time.perf_counter()
    warm_until[0] = now + warmup
    stop_at[0] = now + warmup + seconds
    start.set()
    await asyncio.gather(*tasks)
    return result


def run_load(
    target: Target, *, clients: int = 16, seconds: float = 20.0, warmup: float = 1.0
) -> LoadResult:
    """`clients` concurrent closed-loop clients for `seconds` (after `warmup`), counted."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(target, clients, seconds, warmup))


def fetch_once(target: Target, message: bytes) -> tuple[int, bytes]:
    """One request and its response (status, body), outside the timed runs."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(fetch(target, message))

"""A client that stops taking a streamed answer, over real HTTPS: cut off once it has taken
nothing for the body deadline, while a client reading slowly but steadily gets its whole answer.

Probe "overload" (session 44): a client that opened a run's stream and then stopped reading,
staying connected, held its concurrency slot until it left (72 s in the probe), so
`maxConcurrency` such clients made every other request `HOST_BUSY`. Both clients here have a
4 KiB receive window, and the run's answer (a million U+0001, each sent as the six bytes
`\\u0001`, in its deltas and again in `run.completed`: ~12 MB) is far more than the kernel's
and the host's buffers hold, so the host's writes pause for each of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.serving.server_protocol import HeaderDeadlineProtocol
from tests.support.fake_openai import FakeOpenAI, PlannedResponse
from tests.support.host import RunningHost, serve_in_thread, wait_until
from tests.support.runs_world import RunsWorld, build_runs_world

# The body deadline, which is also how long a client may take nothing of its answer.
WINDOW_S = 4.0
ANSWER_CHARS = 1_000_000  # under the host's bound of 2**20 characters per answer
PIECE = "\x01" * 1000
RUN = {
    "provider": "fake",
    "model": "gpt-4o-mini",
    "input": "How many charge cycles does the battery last?",
    "retrieval": {"corpus": "library", "mode": "before"},
}
SEARCH = {"corpus": "library", "query": "battery"}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[RunsWorld]:
    with FakeOpenAI() as fake:
        built = build_runs_world(tmp_path_factory.mktemp("stall-world"), local_embedding, fake)
        yield built
        built.close()


@pytest.fixture(scope="module")
def host(world: RunsWorld) -> Iterator[RunningHost]:
    limits = world.settings.limits.model_copy(
        update={"max_concurrency": 1, "body_timeout_s": WINDOW_S, "header_timeout_s": 30.0}
    )
    settings = world.settings.model_copy(update={"limits": limits})
    with serve_in_thread(settings, world.driver, world.tls, world.environ) as served:
        yield served


@pytest.fixture(autouse=True)
def large_answer(world: RunsWorld, host: RunningHost) -> Iterator[None]:
    world.fake.reset()
    world.fake.script_chat([PlannedResponse(text=[PIECE] * (ANSWER_CHARS // len(PIECE)))])
    yield
    wait_until(lambda: host.app.counters.in_flight == 0, what="the slot to be released")


def _stalled_readers(host: RunningHost) -> int:
    """Connections cut off for taking nothing, as the metrics count them."""
    protocol = host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    return protocol.rejections().get("stalled-reader", 0)


def _writes_paused(host: RunningHost) -> bool:
    """Whether the host has paused writing on one of its connections (buffers full)."""

    async def look() -> bool:
        return any(
            getattr(getattr(p, "flow", None), "write_paused", False)
            for p in host.server.server_state.connections
        )

    return asyncio.run_coroutine_threadsafe(look(), host.loop).result(timeout=10)


def _search_status(host: RunningHost, world: RunsWorld) -> int:
    with host.client(headers={"Authorization": f"Bearer {world.tokens['alice']}"}) as client:
        return client.post("/v1/retrieval/search", json=SEARCH).status_code


def _open_stream(host: RunningHost, world: RunsWorld) -> tuple[ssl.SSLSocket, bytes]:
    """A run's stream on a connection with a 4 KiB receive window, read up to `run.started`."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before SYN: the window
    raw.settimeout(10.0)
    raw.connect(("127.0.0.1", host.port))
    conn = host.tls.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
    body = json.dumps(RUN).encode()
    conn.sendall(
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        b"Content-Type: application/json\r\n"
        + f"Authorization: Bearer {world.tokens['alice']}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"event: run.started" not in received:
        chunk = conn.recv(4096)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    return conn, received


def _read_to_the_end(conn: ssl.SSLSocket, timeout: float = 60.0) -> tuple[bytes, bool]:
    """What the connection still delivers, and whether it ended (closed or reset) rather than
    reaching the end of the stream's chunked body."""
    received = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = conn.recv(65536)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return received, True
        if not chunk:
            return received, True
        received += chunk
        if received.endswith(b"\r\n0\r\n\r\n"):
            return received, False
    raise AssertionError(
        f"neither the end of the stream nor of the connection: {received[-200:]!r}"
    )


def test_a_client_that_stops_reading_a_stream_is_cut_off_and_its_slot_freed(
    host: RunningHost, world: RunsWorld, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="retrieval_host.http")
    before = _stalled_readers(host)
    conn, _ = _open_stream(host, world)
    with conn:
        stopped = time.monotonic()  # from here on the client reads nothing
        wait_until(lambda: _writes_paused(host), what="the host's writes to pause")
        # The stream holds the only slot: another request is turned away meanwhile.
        assert _search_status(host, world) == 503
        wait_until(
            lambda: host.app.counters.in_flight == 0,
            timeout=WINDOW_S + 30,
            what="the stalled stream's slot to be released",
        )
        assert time.monotonic() - stopped >= WINDOW_S, "cut off before the window had passed"
        assert _search_status(host, world) == 200
        rest, ended = _read_to_the_end(conn)
    assert ended and b"event: run.completed" not in rest
    assert _stalled_readers(host) == before + 1
    cut = [r for r in caplog.records if getattr(r, "fields", {}).get("reason") == "stalled-reader"]
    assert len(cut) == 1 and cut[0].fields["path"] == "/v1/runs"  # type: ignore[attr-defined]
    wait_until(lambda: "running" not in world.run_statuses(), what="the run to be recorded")


def test_a_client_reading_slowly_but_steadily_gets_its_whole_stream(
    host: RunningHost, world: RunsWorld
) -> None:
    before = _stalled_readers(host)
    conn, received = _open_stream(host, world)
    with conn:
        wait_until(lambda: _writes_paused(host), what="the host's writes to pause")
        # A few KiB every tenth of the window, for three windows: far slower than the host
        # writes, so its writes stay paused, but never nothing for a whole window.
        slow_until = time.monotonic() + 3 * WINDOW_S
        while time.monotonic() < slow_until:
            chunk = conn.recv(4096)
            assert chunk, "the host closed the connection of a client that was reading"
            received += chunk
            time.sleep(WINDOW_S / 10)  # the client's own pace, not a wait for the host
        assert _stalled_readers(host) == before, "cut off a client that was reading"
        assert _writes_paused(host), "the answer was no longer held back by this client"
        rest, ended = _read_to_the_end(conn)
    received += rest
    assert not ended, "the stream did not reach its end"
    assert _stalled_readers(host) == before
    completed = re.search(rb"event: run\.completed\r\ndata: ([^\r\n]*)", received)
    assert completed is not None, received[-300:]
    assert json.loads(completed.group(1))["result"]["text"] == "\x01" * ANSWER_CHARS
    # Every delta arrived too: each character once in the deltas, once in `run.completed`.
    assert received.count(b"\\u0001") == 2 * ANSWER_CHARS

"""Limits every route shares, over real HTTPS: body size, concurrency, deadlines, Origin."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from retrieval_host.serving.server_protocol import HeaderDeadlineProtocol
from tests.e2e.conftest import ALLOWED_ORIGIN, DEADLINE_LIMITS, HOST_LIMITS
from tests.support.host import (
    CORPUS,
    RawConnection,
    RawResponse,
    RunningHost,
    World,
    raw_connect,
    serve_in_thread,
    wait_until,
)

LIMIT = int(HOST_LIMITS["maxBodyBytes"])
SLACK = 64 * 1024
SEARCH = {"corpus": CORPUS, "query": "How do I rotate a token?"}


def _ingest_head(world: World, extra: str) -> bytes:
    return (
        "POST /v1/retrieval/ingest?corpus=library&sourceId=upload HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens['alice']}\r\n"
        "Content-Type: text/markdown\r\n"
        f"{extra}\r\n"
    ).encode("ascii")


def test_a_declared_length_over_the_limit_is_refused_before_reading(
    running_host: RunningHost, host_world: World
) -> None:
    with raw_connect(running_host) as conn:
        conn.sendall(_ingest_head(host_world, f"Content-Length: {LIMIT * 40}\r\n"))
        response = conn.read_response()
        closed = conn.closed_by_server()
    assert response.status == 413
    assert response.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert running_host.app.counters.last_rejected_body_bytes == 0
    assert closed, "the connection is closed instead of reading the announced body"


def _send_chunks_until_answered(conn: RawConnection, world: World) -> RawResponse:
    conn.sendall(_ingest_head(world, "Transfer-Encoding: chunked\r\n"))
    piece = b"# heading\n" + b"x" * (16 * 1024 - 10)
    sent = 0
    # Far more than the limit and than the kernel's socket buffers can absorb: the host must
    # answer and close the connection long before all of it is sent.
    total = LIMIT * 128
    try:
        while sent < total and not conn.answered():
            conn.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        pass  # the host closed the connection: its answer is already on the way
    assert sent < total, "the host kept reading"
    return conn.read_response()


def test_a_chunked_body_over_the_limit_gets_413_after_at_most_limit_plus_64k(
    running_host: RunningHost, host_world: World
) -> None:
    counters = running_host.app.counters
    before = counters.too_large_rejections
    with raw_connect(running_host) as conn:
        response = _send_chunks_until_answered(conn, host_world)
    assert response.status == 413
    assert response.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert response.headers["connection"] == "close"
    assert counters.too_large_rejections == before + 1
    read = counters.last_rejected_body_bytes
    assert LIMIT < read <= LIMIT + SLACK, read


def test_a_body_within_the_limit_is_read_whole(
    running_host: RunningHost, host_world: World
) -> None:
    document = b"# Limits\n\nA small document well under the body limit.\n"
    with running_host.client() as client:
        response = client.post(
            f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=small-upload",
            content=iter([document[:10], document[10:]]),  # chunked, no Content-Length
            headers={
                "Authorization": f"Bearer {host_world.tokens['alice']}",
                "Content-Type": "text/markdown",
            },
        )
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("indexed", "unchanged")


def test_concurrency_limit_plus_one_gets_503_at_once_and_probes_still_answer(
    running_host: RunningHost, host_world: World
) -> None:
    slots = int(HOST_LIMITS["maxConcurrency"])
    gate = host_world.gate
    blocked = {"Authorization": f"Bearer {host_world.tokens['blocked']}"}

    def held_search() -> int:
        with running_host.client() as client:
            return client.post("/v1/retrieval/search", json=SEARCH, headers=blocked).status_code

    with ThreadPoolExecutor(slots) as pool, running_host.client() as client:
        client.get("/healthz")  # connection and TLS session ready before timing
        entered = gate.entered
        holders = [pool.submit(held_search) for _ in range(slots)]
        try:
            deadline = time.monotonic() + 10
            while gate.entered < entered + slots:
                assert time.monotonic() < deadline, "the held requests never reached the gate"
                time.sleep(0.002)
            started = time.perf_counter()
            extra = client.post(
                "/v1/retrieval/search",
                json=SEARCH,
                headers={"Authorization": f"Bearer {host_world.tokens['alice']}"},
            )
            elapsed = time.perf_counter() - started
            probe = client.get("/readyz")
        finally:
            gate.release.set()
        statuses = [h.result(timeout=30) for h in holders]
    assert extra.status_code == 503
    assert extra.json()["code"] == "HOST_BUSY"
    assert elapsed < 0.1, elapsed
    assert probe.status_code == 200  # probes are exempt from the limit
    assert statuses == [200] * slots
    assert running_host.app.counters.in_flight == 0


def test_headers_sent_one_byte_a_second_are_cut_off_at_the_deadline(
    deadline_host: RunningHost,
) -> None:
    deadline = float(DEADLINE_LIMITS["headerTimeoutS"])
    protocol = deadline_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.header_timeouts
    request = b"GET /v1/protocol HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    outcome: dict[str, object] = {}

    def slow_client() -> None:
        with raw_connect(deadline_host) as conn:
            started = time.monotonic()
            for byte in request:
                conn.send_quietly(bytes([byte]))
                # One byte a second: wait a second for an answer before sending the next.
                if conn.answered(timeout=1.0):
                    break
            outcome["elapsed"] = time.monotonic() - started
            outcome["response"] = conn.read_response()
            outcome["closed"] = conn.closed_by_server()

    slow = threading.Thread(target=slow_client)
    slow.start()
    served = []
    with deadline_host.client() as client:
        while slow.is_alive():
            served.append(client.get("/v1/protocol").status_code)
    slow.join()

    response = outcome["response"]
    assert isinstance(response, RawResponse)
    assert response.status == 408
    assert response.json()["code"] == "TIMEOUT"
    assert outcome["closed"] is True
    elapsed = outcome["elapsed"]
    assert isinstance(elapsed, float)
    assert deadline - 0.05 <= elapsed < deadline + 1.0, elapsed
    assert protocol.header_timeouts == before + 1
    assert len(served) >= 5 and set(served) == {200}  # others were served meanwhile


def _handshaken(host: RunningHost) -> RawConnection:
    """A connection to the deadline host whose TLS handshake beat its 1 s header deadline:
    under load a handshake took longer, and the host rightly cut it (the whole suite under
    `under-load`, session 42); the body's deadline is what the caller times."""
    for _ in range(4):
        try:
            return raw_connect(host)
        except (ssl.SSLError, ConnectionResetError):
            continue
    return raw_connect(host)


def test_a_body_sent_too_slowly_is_cut_off_at_the_body_deadline(
    deadline_host: RunningHost, host_world: World
) -> None:
    deadline = float(DEADLINE_LIMITS["bodyTimeoutS"])
    before = deadline_host.app.counters.body_timeouts
    with _handshaken(deadline_host) as conn:
        conn.sendall(_ingest_head(host_world, "Content-Length: 1000\r\n"))
        started = time.monotonic()
        while not conn.answered(timeout=1.0):  # one body byte a second
            conn.send_quietly(b"x")
            assert time.monotonic() - started < deadline + 5, "never cut off"
        response = conn.read_response()
        elapsed = time.monotonic() - started
        closed = conn.closed_by_server()
    assert response.status == 408
    assert response.json()["reason"] == "request-timeout"
    assert deadline - 0.1 <= elapsed < deadline + 1.5, elapsed
    assert deadline_host.app.counters.body_timeouts == before + 1
    assert closed


def test_a_disallowed_origin_gets_403_and_an_allowed_one_gets_cors(
    running_host: RunningHost, host_world: World
) -> None:
    auth = {"Authorization": f"Bearer {host_world.tokens['alice']}"}
    with running_host.client() as client:
        evil = client.post(
            "/v1/retrieval/search", json=SEARCH, headers={**auth, "Origin": "https://evil.example"}
        )
        evil_probe = client.get("/v1/protocol", headers={"Origin": "null"})
        good = client.post(
            "/v1/retrieval/search", json=SEARCH, headers={**auth, "Origin": ALLOWED_ORIGIN}
        )
        preflight = client.options(
            "/v1/retrieval/search",
            headers={
                "Origin": ALLOWED_ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        no_origin = client.post("/v1/retrieval/search", json=SEARCH, headers=auth)
    assert evil.status_code == 403
    assert evil.json()["code"] == "PERMISSION_DENIED"
    assert evil.json()["reason"] == "origin-not-allowed"
    assert "access-control-allow-origin" not in evil.headers
    assert evil_probe.status_code == 403
    assert good.status_code == 200
    assert good.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    exposed = {h.strip().lower() for h in good.headers["access-control-expose-headers"].split(",")}
    assert exposed == {"x-request-id", "retry-after"}  # a page reads a 503's wait
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert no_origin.status_code == 200


def test_a_tls_handshake_never_begun_is_cut_off_at_the_header_deadline(
    deadline_host: RunningHost,
) -> None:
    # A black-box tester's connections that sent nothing (or half a ClientHello) were held
    # for asyncio's 60 s handshake timeout, each a file descriptor, with no request to time.
    deadline = float(DEADLINE_LIMITS["headerTimeoutS"])
    with socket.create_connection(("127.0.0.1", deadline_host.port), timeout=60) as silent:
        started = time.monotonic()
        try:
            closed = silent.recv(1) == b""  # blocks until the host closes (or resets)
        except ConnectionResetError:
            closed = True
        elapsed = time.monotonic() - started
    assert closed
    assert deadline - 0.05 <= elapsed < 30.0, elapsed  # 60 s before


def test_plain_http_on_the_tls_port_gets_no_answer(running_host: RunningHost) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{running_host.port}", timeout=5) as client:
        try:
            response = client.get("/v1/protocol")
        except httpx.TransportError:
            return
    assert response.status_code != 200


def test_a_body_nobody_reads_cannot_keep_the_connection_open(deadline_host: RunningHost) -> None:
    deadline = float(DEADLINE_LIMITS["bodyTimeoutS"])
    protocol = deadline_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.body_timeouts
    with raw_connect(deadline_host) as conn:
        # The route answers without reading the announced body; the client then trickles it.
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        assert conn.read_response().status == 200
        while not conn.closed_by_server(timeout=1.0):  # one body byte a second
            conn.send_quietly(b"x")
            assert time.monotonic() - started < deadline + 5, "never cut off"
        elapsed = time.monotonic() - started
    assert deadline <= elapsed < deadline + 2.0, elapsed
    assert protocol.body_timeouts == before + 1


def test_searches_queue_for_their_own_threads_and_other_work_goes_on(
    host_world: World,
) -> None:
    # `limits.searchThreads: 1`: three held searches, one running, two queued for the search
    # thread, none holding a request thread: listing corpora (request threads) is answered.
    settings = host_world.settings(limits={"maxConcurrency": 4, "searchThreads": 1})
    gate = host_world.gate
    gate.release.clear()
    blocked = {"Authorization": f"Bearer {host_world.tokens['blocked']}"}
    alice = {"Authorization": f"Bearer {host_world.tokens['alice']}"}
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:

        def held_search() -> int:
            with host.client() as client:
                return client.post("/v1/retrieval/search", json=SEARCH, headers=blocked).status_code

        with ThreadPoolExecutor(3) as pool, host.client() as client:
            entered = gate.entered
            try:
                holders = [pool.submit(held_search) for _ in range(3)]
                wait_until(lambda: host.app.counters.in_flight == 3, what="three searches in")
                wait_until(lambda: gate.entered == entered + 1, what="the first search held")
                listed = client.get("/v1/corpora", headers=alice)
                searchers = [t for t in threading.enumerate() if t.name.startswith("search-work")]
                held = gate.entered - entered
            finally:
                gate.release.set()
            statuses = [h.result(timeout=30) for h in holders]
    assert listed.status_code == 200, listed.text
    assert len(searchers) == 1
    assert held == 1  # the other two waited for the one search thread
    assert statuses == [200] * 3

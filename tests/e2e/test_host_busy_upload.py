"""A request with a large body turned away `HOST_BUSY` closes its connection, over real HTTPS.

Probe "overload" (session 44): the `busy` 503 kept the connection alive, so the server went on
reading (and discarding) the whole body of an upload it had refused, up to `maxBodyBytes`,
before the connection could serve anything else; the `ingest-bytes` 503 already closed it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.support.host import (
    CORPUS,
    RawResponse,
    RunningHost,
    World,
    raw_connect,
    serve_in_thread,
    wait_until,
)

LIMITS = {"maxConcurrency": 1, "maxBodyBytes": 4 * 1024 * 1024}
SEARCH = {"corpus": CORPUS, "query": "How do I rotate a token?"}
INGEST = "/v1/retrieval/ingest?corpus=library&sourceId=busy"
INDEX = "/v1/retrieval/index"


def _busy(host: RunningHost, world: World, path: str, framing: str) -> tuple[RawResponse, bool]:
    """The answer to a request head whose body is never sent, and whether the host closed."""
    with raw_connect(host) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {world.tokens['alice']}\r\n{framing}\r\n".encode("ascii")
        )
        response = conn.read_response()
        return response, conn.closed_by_server(timeout=3.0)  # keep-alive: 5 s


def test_a_large_body_turned_away_busy_closes_its_connection_unread(host_world: World) -> None:
    gate = host_world.gate
    gate.release.clear()
    blocked = {"Authorization": f"Bearer {host_world.tokens['blocked']}"}
    settings = host_world.settings(limits=LIMITS)
    with (
        serve_in_thread(settings, host_world.driver, host_world.tls) as host,
        ThreadPoolExecutor(1) as pool,
    ):

        def held_search() -> int:
            with host.client(headers=blocked) as client:
                return client.post("/v1/retrieval/search", json=SEARCH).status_code

        entered = gate.entered
        holder = pool.submit(held_search)
        try:
            wait_until(lambda: gate.entered == entered + 1, what="the search to hold the slot")
            for path, framing in [
                (INGEST, "Content-Type: text/markdown\r\nContent-Length: 3000000\r\n"),
                (INDEX, "Content-Type: application/json\r\nContent-Length: 900000\r\n"),
                (INGEST, "Content-Type: text/markdown\r\nTransfer-Encoding: chunked\r\n"),
            ]:
                response, closed = _busy(host, host_world, path, framing)
                assert (response.status, response.json()["reason"]) == (503, "busy"), framing
                assert response.headers.get("connection") == "close", framing
                assert closed, "the host kept the connection to read the refused body"
            # A request without a body keeps its connection for the retry.
            response, closed = _busy(host, host_world, INDEX, "Content-Length: 0\r\n")
            assert (response.status, "connection" in response.headers) == (503, False)
            assert not closed
        finally:
            gate.release.set()
        assert holder.result(timeout=30) == 200

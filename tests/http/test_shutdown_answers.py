"""Every request in flight when the host shuts down is answered with a problem body, however
late its work would return (on a loaded machine, seconds after its token was cancelled)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from starlette.types import Message

from retrieval_host.http.app import create_app
from tests.support.host import CORPUS, World, wait_until

pytestmark = pytest.mark.anyio

SEARCH = {"corpus": CORPUS, "query": "battery lifetime"}


def _problem(status: int, headers: dict[str, str], body: bytes) -> dict[str, object]:
    assert headers["content-type"] == "application/problem+json", (status, headers, body)
    problem = json.loads(body)
    assert isinstance(problem, dict)
    assert problem["status"] == status
    return problem


async def test_past_the_cutoff_work_that_ignores_its_cancel_is_answered_without_it(
    http_world: World,
) -> None:
    # The authorizer of the subject `blocked` waits for the gate and never checks the token:
    # work that does not reach its next cancel check before the server's deadline.
    app = create_app(http_world.settings(limits={"shutdownGraceS": 0.4}), http_world.driver)
    gate = http_world.gate
    entered = gate.entered
    headers = {"Authorization": f"Bearer {http_world.tokens['blocked']}"}
    transport = httpx.ASGITransport(app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="https://host") as client:
            request = asyncio.ensure_future(
                client.post("/v1/retrieval/search", json=SEARCH, headers=headers)
            )
            await asyncio.to_thread(wait_until, lambda: gate.entered > entered, 10, "the gate")
            cut = time.monotonic()
            app.shutdown.cut()
            # Bounded: on a host that waits for the work, this fails instead of hanging.
            response = await asyncio.wait_for(request, 10)
            waited = time.monotonic() - cut
            assert not gate.release.is_set()  # answered while the work still runs
    finally:
        gate.release.set()
        app.routes.close()
    problem = _problem(response.status_code, dict(response.headers), response.content)
    assert (problem["code"], problem["reason"]) == ("CANCELLED", "shutdown")
    # The work may still be committing: the answer does not claim it was undone.
    assert "may still take effect" in str(problem["detail"])
    assert problem["requestId"] == response.headers["x-request-id"]
    assert waited >= app.shutdown.wind_down_s / 2


async def test_a_request_the_server_cancels_at_its_deadline_gets_the_shutdown_problem(
    http_world: World,
) -> None:
    # uvicorn cancels the requests still running at the end of the grace period; what escapes
    # the application then is answered by uvicorn itself with a plain-text 500.
    app = create_app(http_world.settings(), http_world.driver)
    waiting = asyncio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        waiting.set()
        await asyncio.Event().wait()  # the body never comes
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    token = http_world.tokens["alice"]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": "/v1/retrieval/search",
        "raw_path": b"/v1/retrieval/search",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"40"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 443),
    }
    task = asyncio.ensure_future(app(scope, receive, send))
    try:
        await asyncio.wait_for(waiting.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # the cancellation goes on after the answer
    finally:
        app.routes.close()
    start, body = sent
    assert start["type"] == "http.response.start"
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    problem = _problem(start["status"], headers, body["body"])
    assert (problem["code"], problem["reason"]) == ("CANCELLED", "shutdown")
    assert problem["requestId"] == headers["x-request-id"]

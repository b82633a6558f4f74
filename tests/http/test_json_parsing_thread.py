"""Large JSON bodies are parsed off the event loop; small ones on it (a thread hop costs more).

A black-box tester saw `/healthz` answer in 1-7 s while 8 MiB JSON bodies were being parsed:
parsing ran on the event loop, which every connection shares."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, ClassVar

import pytest
from starlette.requests import Request

from retrieval_host.http.auth import TokenAuthenticator
from retrieval_host.http.policy import INLINE_PARSE_BYTES, RequestPolicy
from retrieval_host_client import models as wire


class Recording(wire.SearchRequest):
    """The wire model, noting the thread its body was validated on."""

    threads: ClassVar[list[str]] = []

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Any:
        cls.threads.append(threading.current_thread().name)
        return super().model_validate_json(*args, **kwargs)


def _request(body: bytes) -> Request:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/retrieval/search",
        "headers": [(b"content-type", b"application/json")],
    }
    return Request(scope, receive)


@pytest.mark.parametrize(("size", "off_loop"), [(200, False), (INLINE_PARSE_BYTES + 1, True)])
def test_a_body_is_parsed_where_its_size_says(size: int, off_loop: bool) -> None:
    query = "how do I rotate a token"
    body = json.dumps({"corpus": "library", "query": query}).encode()
    body += b" " * max(0, size - len(body))  # white space: valid JSON, any size
    assert (len(body) > INLINE_PARSE_BYTES) is off_loop
    policy = RequestPolicy(TokenAuthenticator([]), max_concurrency=2)
    Recording.threads.clear()

    async def parse() -> tuple[wire.SearchRequest, str]:
        parsed = await policy.parse_json(_request(body), Recording)
        return parsed, threading.current_thread().name

    try:
        parsed, loop_thread = asyncio.run(parse())
    finally:
        policy.close()
    assert parsed.query == query
    assert (Recording.threads[0] != loop_thread) is off_loop
    if off_loop:
        assert Recording.threads[0].startswith("request-work")

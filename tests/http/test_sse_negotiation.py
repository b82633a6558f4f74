"""Who gets a stream: the `Accept` header read as RFC 9110 says (weights, case)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from retrieval_host.http.sse import wants_stream


def _request(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode("latin-1"))]
    return Request({"type": "http", "method": "POST", "path": "/v1/runs", "headers": headers})


@pytest.mark.parametrize(
    ("accept", "stream"),
    [
        ("text/event-stream", True),
        ("TEXT/EVENT-STREAM", True),
        ("text/event-stream; charset=utf-8", True),
        ("application/json, text/event-stream", True),
        ("text/event-stream;q=0.5, application/json;q=0.9", False),
        ("text/event-stream;q=0.9, application/json;q=0.5", True),
        ("text/event-stream;q=0", False),
        ("text/event-stream;q=0, application/json", False),
        ("text/event-stream; Q=0", False),
        ("text/event-stream;q=bogus", True),
        ("*/*", False),
        ("*/*;q=0.1, text/event-stream", True),
        ("application/json", False),
        ("", False),
        (None, False),
    ],
)
def test_the_stream_is_sent_when_accept_prefers_it(accept: str | None, stream: bool) -> None:
    assert wants_stream(_request(accept)) is stream

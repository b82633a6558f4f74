"""What the server protocol and the JSON parsing refuse, over real HTTPS: oversized header
sections, requests that are not HTTP, JSON nested too deeply, JSON bodies over their limit."""

from __future__ import annotations

import json
import logging
import time
import urllib.parse

import httpx
import pytest

from retrieval_host.serving.server_protocol import (
    MAX_HEADER_BYTES,
    MAX_PIPELINED,
    HeaderDeadlineProtocol,
    _head_size,
)
from tests.e2e.conftest import HOST_LIMITS
from tests.support.host import (
    CORPUS,
    RawResponse,
    RunningHost,
    World,
    raw_connect,
    serve_in_thread,
    wait_until,
)

JSON_LIMIT = int(HOST_LIMITS["maxJsonBodyBytes"])


def _request(host: RunningHost, data: bytes) -> tuple[RawResponse, bool]:
    with raw_connect(host) as conn:
        conn.sendall(data)
        response = conn.read_response()
        return response, conn.closed_by_server()


def _assert_problem(response: RawResponse, status: int, reason: str | None) -> None:
    assert response.status == status, response.body
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert body["code"] == "INVALID_REQUEST"
    assert body["reason"] == reason
    assert body["requestId"] == response.headers["x-request-id"]


def test_a_header_section_over_the_bound_gets_431_and_the_connection_closes(
    running_host: RunningHost,
) -> None:
    protocol = running_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.headers_too_large
    with raw_connect(running_host) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        # One header value, in pieces, until the host answers (it would otherwise buffer the
        # whole value). Past the bound the client waits for the answer before sending more,
        # so the host has read everything sent and closes cleanly (no reset losing the reply).
        sent = 0
        while not conn.answered(timeout=5.0 if sent > MAX_HEADER_BYTES else 0.0):
            assert sent < 4 * MAX_HEADER_BYTES, "the host read far past the bound"
            conn.send_quietly(b"a" * 8192)
            sent += 8192
        response = conn.read_response()
        closed = conn.closed_by_server()
    _assert_problem(response, 431, "headers-too-large")
    assert closed
    assert protocol.headers_too_large == before + 1


def test_many_headers_within_the_bound_are_served(running_host: RunningHost) -> None:
    lines = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"b" * 900) for i in range(60))  # ~55 KiB
    assert len(lines) < MAX_HEADER_BYTES - 1024
    response, _ = _request(
        running_host,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + lines + b"Connection: close\r\n\r\n",
    )
    assert response.status == 200


@pytest.mark.parametrize("method", [b"GET", b"DELETE", b"OPTIONS"])
def test_a_head_of_exactly_the_bound_is_served_whatever_the_method(
    running_host: RunningHost, method: bytes
) -> None:
    # A black-box test: the request line was counted as if every method had four letters, so
    # a GET of exactly 64 KiB was refused and a DELETE two bytes over it was served.
    start = method + b" /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Big: "
    head = start + b"a" * (MAX_HEADER_BYTES - len(start) - 4) + b"\r\n\r\n"
    assert len(head) == MAX_HEADER_BYTES
    headers = [tuple(line.split(b": ", 1)) for line in head.split(b"\r\n")[1:-2]]
    assert _head_size(method, b"/healthz", headers) == len(head)  # type: ignore[arg-type]
    response, _ = _request(running_host, head)
    assert response.status != 431, response.body


@pytest.mark.parametrize("size", [MAX_HEADER_BYTES + 2_000, 100_000, 150_000])
def test_a_header_section_over_the_bound_sent_at_once_gets_431(
    running_host: RunningHost, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box tester's 66-160 KB header sections were served when they arrived within one
    # transport read: the streaming count only looked after the headers had completed.
    caplog.set_level(logging.INFO, logger="retrieval_host.access")
    protocol = running_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.headers_too_large
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    padding = b"a" * (size - len(head) - 4)
    response: RawResponse | None = None
    with raw_connect(running_host) as conn:
        conn.send_quietly(head + padding + b"\r\n\r\n")
        try:
            response = conn.read_response()
        except (AssertionError, OSError):
            # Refused by the running count with bytes still unread, the host's close can reset
            # the connection and lose its answer: what it did is in its counter and log.
            response = None

    # The access line every request gets (a black-box tester found none for 431 and 400),
    # written last, and no other: the request was never served.
    def access_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "retrieval_host.access"]

    wait_until(lambda: bool(access_lines()), what="the refusal's access line")
    lines = access_lines()
    assert [getattr(r, "fields", {}).get("status") for r in lines] == [431]
    fields = getattr(lines[0], "fields", {})
    assert (fields["code"], fields["reason"]) == ("INVALID_REQUEST", "headers-too-large")
    assert protocol.headers_too_large == before + 1
    if response is not None:
        _assert_problem(response, 431, "headers-too-large")
        assert getattr(lines[0], "request_id", None) == response.headers["x-request-id"]


@pytest.mark.parametrize("keep_alive", [False, True], ids=["first-request", "keep-alive"])
@pytest.mark.parametrize("over", [0, 1])
def test_white_space_around_header_values_counts_toward_the_bound(
    running_host: RunningHost, keep_alive: bool, over: int
) -> None:
    # A black-box test: a 100 KB head of values padded with spaces was served when it arrived
    # in one read (only the parsed values, stripped of the padding, were measured).
    start = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad:"
    end = b"a \r\nConnection: close\r\n\r\n"
    head = start + b" " * (MAX_HEADER_BYTES + over - len(start) - len(end)) + end
    assert len(head) == MAX_HEADER_BYTES + over
    with raw_connect(running_host) as conn:
        if keep_alive:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert conn.read_response().status == 200
        conn.sendall(head)
        response = conn.read_response()
    if over:
        _assert_problem(response, 431, "headers-too-large")
    else:
        assert response.status == 200, response.body


@pytest.mark.parametrize(("size", "status"), [(62_000, 200), (100_000, 431)])
def test_a_pipelined_head_is_measured_without_the_request_before_it(
    running_host: RunningHost, size: int, status: int
) -> None:
    # A black-box test: a 62,000-byte head sent behind a POST in one write was charged the
    # POST's bytes and refused 431; the same head alone was served.
    body = b'{"corpus": "library", "query": "' + b"q" * 7_000 + b'"}'
    post = (
        b"POST /v1/retrieval/search HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    start = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Big: "
    head = start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"
    protocol = running_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.headers_too_large
    second: RawResponse | None = None
    with raw_connect(running_host) as conn:
        conn.send_quietly(post + head)
        first = conn.read_response()
        assert first.status == 401  # no token: answered, and the connection goes on
        try:
            second = conn.read_response()
        except (AssertionError, OSError):
            # Refused with bytes still unread, the host's close can reset the connection and
            # lose its answer: what it did is in its counter.
            assert status == 431
    if status == 431:
        wait_until(lambda: protocol.headers_too_large == before + 1, what="the 431")
    else:
        assert protocol.headers_too_large == before
    assert second is None or second.status == status, second.body


def test_a_connection_may_queue_a_few_pipelined_requests_and_is_closed_past_them(
    running_host: RunningHost,
) -> None:
    # A black-box tester pipelined 400,000 requests per connection without reading an answer:
    # uvicorn queued them all (2.7 GB in 30 s from four connections, no token needed).
    protocol = running_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    one = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    before = protocol.pipelines_too_deep
    with raw_connect(running_host) as conn:
        conn.sendall(one * (1 + MAX_PIPELINED))  # the one answered first, and those queued
        answers = [conn.read_response() for _ in range(1 + MAX_PIPELINED)]
        assert [a.status for a in answers] == [200] * (1 + MAX_PIPELINED)
        conn.sendall(one)  # and the connection is still served
        assert conn.read_response().status == 200
    assert protocol.pipelines_too_deep == before
    with raw_connect(running_host) as conn:
        conn.send_quietly(one * 2_000)
        answered = 0
        while not conn.eof:
            try:
                conn.read_response()
            except AssertionError:  # closed before the next answer
                break
            answered += 1
        assert conn.closed_by_server()
    assert answered <= 1 + MAX_PIPELINED
    assert protocol.pipelines_too_deep == before + 1


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/retrieval/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"NOT-HTTP\r\n\r\n",
        # A black-box test found these served (RFC 9112 3.2: exactly one Host in HTTP/1.1;
        # 3.2.2: an absolute-form target names the host it is for).
        b"GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
        b"GET https://evil.example/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        # And what a second black-box test found past the first rules.
        b"GET ftp://evil.example/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET https://127.0.0.1:x@evil.example/healthz HTTP/1.1\r\n"
        b"Host: 127.0.0.1:x@evil.example\r\n\r\n",
        b"GET https://u@127.0.0.1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ],
    ids=[
        "length-and-chunked",
        "two-lengths",
        "garbage",
        "no-host",
        "two-hosts",
        "absolute-form-elsewhere",
        "http-0.9",
        "absolute-form-other-scheme",
        "userinfo-in-host",
        "userinfo-in-target",
    ],
)
def test_a_request_that_is_not_http_gets_a_problem_body_with_a_request_id(
    running_host: RunningHost, request_bytes: bytes
) -> None:
    protocol = running_host.server.config.http_protocol_class
    assert issubclass(protocol, HeaderDeadlineProtocol)
    before = protocol.bad_requests
    response, closed = _request(running_host, request_bytes)
    _assert_problem(response, 400, "bad-http")
    assert closed
    # In the metrics, as the application's own refusals are (a black-box test found none).
    assert protocol.bad_requests == before + 1
    exposition = running_host.app.metrics.render().decode()
    counted = f'retrieval_host_limit_rejections_total{{reason="bad-http"}} {before + 1}.0'
    assert counted in exposition


def test_a_bad_request_behind_a_good_one_is_answered_after_it(running_host: RunningHost) -> None:
    # A black-box test: the 400 of a request pipelined behind a run was written first, read as
    # the run's answer, and the run was cancelled.
    good = b"GET /v1/protocol HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    bad = b"GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n"  # no Host
    with raw_connect(running_host) as conn:
        conn.sendall(good + good + bad)
        answers = [conn.read_response() for _ in range(3)]
        assert conn.closed_by_server()
    assert [a.status for a in answers] == [200, 200, 400]
    assert "capabilities" in answers[0].json() and "capabilities" in answers[1].json()
    _assert_problem(answers[2], 400, "bad-http")


def test_a_body_that_does_not_parse_is_answered_at_once_and_once(
    running_host: RunningHost, host_world: World
) -> None:
    # A second black-box test: the problem of a request whose own chunked body broke was
    # deferred behind that request, which then waited out the body deadline (408, not 400);
    # answered early by the application (401), the same request got a second answer, the 400.
    broken = b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n"
    token = f"Authorization: Bearer {host_world.tokens['alice']}\r\n".encode()
    head = b"POST /v1/retrieval/search HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with raw_connect(running_host) as conn:
        conn.sendall(head + token + broken)
        _assert_problem(conn.read_response(), 400, "bad-http")
        assert conn.closed_by_server()
    with raw_connect(running_host) as conn:
        conn.sendall(head + broken)  # no token: refused before its body is read
        first = conn.read_response()
        assert first.status in (400, 401), first.body
        leftover, deadline = conn.buffer, time.monotonic() + 30  # a bound, not a pause
        while not conn.eof and time.monotonic() < deadline:
            conn.buffer = b""
            conn._read(1.0)
            leftover += conn.buffer
        assert conn.eof  # closed after its answer
        assert b"HTTP/1.1" not in leftover  # one request, one answer


def test_an_absolute_form_target_naming_the_host_itself_is_served(
    running_host: RunningHost,
) -> None:
    for target, host in (
        (b"https://127.0.0.1/healthz", b"127.0.0.1"),
        # As a proxy may write them: the default port on one side only, another case.
        (b"https://127.0.0.1/healthz", b"127.0.0.1:443"),
        (b"https://127.0.0.1:443/healthz", b"127.0.0.1"),
        (b"HTTPS://127.0.0.1/healthz?x", b"127.0.0.1"),
    ):
        response, _ = _request(
            running_host,
            b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n",
        )
        assert response.status == 200, (target, host)
    old_client, _ = _request(running_host, b"GET /healthz HTTP/1.0\r\n\r\n")  # no Host in 1.0
    assert old_client.status == 200


def _as_alice(host: RunningHost, world: World) -> httpx.Client:
    return host.client(headers={"Authorization": f"Bearer {world.tokens['alice']}"})


def _search_text(client: httpx.Client, body: str) -> httpx.Response:
    """A search whose JSON body is sent as written (what httpx's `json=` could not write)."""
    return client.post(
        "/v1/retrieval/search", content=body, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize("depth", [300, 1_000, 20_000])
def test_json_nested_too_deeply_is_400_not_a_failure_of_the_host(
    running_host: RunningHost, host_world: World, depth: int
) -> None:
    body = f'{{"corpus":"{CORPUS}","query":"x","filters":{"[" * depth}{"]" * depth}}}'
    assert len(body) < JSON_LIMIT
    with _as_alice(running_host, host_world) as client:
        response = _search_text(client, body)
        assert response.status_code == 400, response.text
        assert response.json()["reason"] == "json-depth"
        # The host goes on serving.
        assert client.post("/v1/retrieval/search", json={"corpus": CORPUS, "query": "x"}).is_success


def test_a_query_string_on_a_json_route_is_ambiguous_not_ignored(
    running_host: RunningHost, host_world: World
) -> None:
    # A black-box test: `?corpus=other&limit=1` beside a body naming the corpus was ignored.
    with _as_alice(running_host, host_world) as client:
        body = {"corpus": CORPUS, "query": "x"}
        refused = client.post("/v1/retrieval/search?corpus=other&limit=1", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["reason"] == "query-on-json-route"
        assert client.post("/v1/retrieval/search", json=body).status_code == 200


def test_a_number_longer_than_the_host_reads_is_said_to_be_so(
    running_host: RunningHost, host_world: World
) -> None:
    # A black-box test: an integer of 5,000 digits (valid JSON) was "not valid JSON".
    body = f'{{"corpus":"{CORPUS}","query":"x","filters":{{"year":{"9" * 5000}}}}}'
    with _as_alice(running_host, host_world) as client:
        response = _search_text(client, body)
    assert response.status_code == 400, response.text
    assert "more digits than the host reads (4,300)" in response.json()["detail"]


def test_a_metadata_parameter_nested_too_deeply_is_400(
    running_host: RunningHost, host_world: World
) -> None:
    metadata = urllib.parse.quote("[" * 3_000 + "]" * 3_000)
    with running_host.client(
        headers={"Authorization": f"Bearer {host_world.tokens['alice']}"}
    ) as client:
        response = client.post(
            f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=deep&metadata={metadata}",
            content=b"# Deep\n\ntext\n",
            headers={"Content-Type": "text/markdown"},
        )
    assert response.status_code == 400, response.text
    assert response.json()["reason"] == "json-depth"


def test_json_routes_take_bodies_up_to_max_json_body_bytes_and_ingest_up_to_max_body_bytes(
    running_host: RunningHost, host_world: World
) -> None:
    assert int(HOST_LIMITS["maxBodyBytes"]) > JSON_LIMIT
    head = f'{{"corpus":"{CORPUS}","query":"x"'
    within = head + " " * (JSON_LIMIT - len(head) - 1) + "}"  # exactly the limit
    assert len(within) == JSON_LIMIT
    over = head + " " * (JSON_LIMIT - len(head)) + "}"  # one byte more
    with running_host.client(
        headers={"Authorization": f"Bearer {host_world.tokens['alice']}"}
    ) as client:
        protocol = client.get("/v1/protocol").json()
        assert protocol["limits"]["maxJsonBodyBytes"] == JSON_LIMIT
        headers = {"Content-Type": "application/json"}
        assert client.post("/v1/retrieval/search", content=within, headers=headers).is_success
        refused = client.post("/v1/retrieval/search", content=over, headers=headers)
        assert refused.status_code == 413
        assert refused.json()["code"] == "PAYLOAD_TOO_LARGE"
        assert str(JSON_LIMIT) in refused.json()["detail"]
        # A raw document over the JSON limit (and within maxBodyBytes) is read whole and judged
        # as a document: bytes that are not the PDF they claim to be (answered without
        # embedding anything, so the test does not wait on the model under load).
        document = b"# Large\n\n" + b"A line of the large note.\n" * (JSON_LIMIT // 25 + 100)
        assert JSON_LIMIT < len(document) < int(HOST_LIMITS["maxBodyBytes"])
        judged = client.post(
            f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=large-note",
            content=document,
            headers={"Content-Type": "application/pdf"},
        )
        assert judged.status_code == 422, judged.text
        assert json.loads(judged.text)["reason"] == "content-type-mismatch"


@pytest.mark.parametrize("path", ["/v1/protocol", "/healthz", "/v1/openapi.json"])
def test_a_token_in_the_query_string_is_refused_on_public_routes_too(
    running_host: RunningHost, host_world: World, path: str
) -> None:
    token = host_world.tokens["alice"]
    with running_host.client() as client:
        assert client.get(path).status_code == 200
        for query in (f"access_token={token}", f"q=Bearer%20{token}", "token=anything"):
            response = client.get(f"{path}?{query}")
            assert response.status_code == 401, (path, query)
            assert response.json()["reason"] == "token-in-query"
            assert response.headers["www-authenticate"] == 'Bearer realm="retrieval-host"'


def test_a_content_coding_is_refused_and_two_content_types_are_ambiguous(
    running_host: RunningHost, host_world: World
) -> None:
    body = json.dumps({"corpus": CORPUS, "query": "How do I rotate a token?", "limit": 1})
    auth = {"Authorization": f"Bearer {host_world.tokens['alice']}"}
    with running_host.client(headers=auth) as client:
        for coding in ("gzip", "br", "identity, gzip"):
            refused = client.post(
                "/v1/retrieval/search",
                content=body,
                headers={"Content-Type": "application/json", "Content-Encoding": coding},
            )
            assert refused.status_code == 415, coding
            assert refused.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"
        plain = client.post(
            "/v1/retrieval/search",
            content=body,
            headers={"Content-Type": "application/json", "Content-Encoding": "identity"},
        )
        assert plain.status_code == 200
        doubled = client.post(
            "/v1/retrieval/search",
            content=body,
            headers=[("Content-Type", "application/json"), ("Content-Type", "text/plain")],
        )
        assert doubled.status_code == 400
        assert doubled.json()["reason"] == "duplicate-header"


def test_every_answer_says_no_store_and_nosniff(
    running_host: RunningHost, host_world: World
) -> None:
    auth = {"Authorization": f"Bearer {host_world.tokens['alice']}"}
    with running_host.client(headers=auth) as client:
        answers = [
            client.post("/v1/retrieval/search", json={"corpus": CORPUS, "query": "token"}),
            client.get("/v1/protocol"),
            client.get("/v1/corpora"),
            client.post("/v1/retrieval/search", json={"corpus": CORPUS}),  # a 422 problem
            client.get("/no-such-route"),
        ]
    for response in answers:
        assert response.headers["cache-control"] == "no-store", response.url
        assert response.headers["x-content-type-options"] == "nosniff", response.url
    assert [r.status_code for r in answers] == [200, 200, 200, 422, 404]


BUDGET_LIMITS = {"maxBodyBytes": 4096, "maxIngestBytesInFlight": 6000, "maxConcurrency": 4}


def _upload_head(
    world: World, source_id: str, length: int | None, *, token: str = "admin"
) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST /v1/retrieval/ingest?corpus={CORPUS}&sourceId={source_id} HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens[token]}\r\n"
        "Content-Type: text/markdown\r\n"
        f"{framing}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")


def _note(size: int) -> bytes:
    text = b"# Budget\n\n" + b"The pump is checked every morning.\n" * (size // 35 + 1)
    return text[:size]


def test_uploads_in_flight_share_a_budget_of_bytes(host_world: World) -> None:
    # A black-box tester's 16 uploads of 31 MiB each, within maxBodyBytes and maxConcurrency,
    # took the host past the 1.5 GB its own Kubernetes manifest allows.
    settings = host_world.settings(limits=BUDGET_LIMITS)
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        counters = host.app.counters
        with raw_connect(host) as holding:
            # An upload whose body has not come yet already holds its declared bytes.
            holding.sendall(_upload_head(host_world, "held", 4000))
            wait_until(lambda: counters.ingest_bytes == 4000, what="the first upload's bytes")
            with raw_connect(host) as second:
                second.sendall(_upload_head(host_world, "second", 4000) + _note(4000))
                refused = second.read_response()
                assert second.closed_by_server()
            assert refused.status == 503, refused.body
            assert (refused.json()["code"], refused.json()["reason"]) == (
                "HOST_BUSY",
                "ingest-bytes",
            )
            assert refused.headers["retry-after"] == "1"
            # One that fits beside it is served: a budget, not a lock.
            with raw_connect(host) as small:
                small.sendall(_upload_head(host_world, "small", 1500) + _note(1500))
                assert small.read_response().status == 200
            # Without a length, bytes count as they arrive: 2,500 more do not fit.
            with raw_connect(host) as chunked:
                chunk = _note(2500)
                chunked.sendall(
                    _upload_head(host_world, "chunked", None)
                    + f"{len(chunk):x}\r\n".encode()
                    + chunk
                    + b"\r\n"
                )
                late = chunked.read_response()
            assert late.status == 503 and late.json()["reason"] == "ingest-bytes"
        # The first client left: its bytes are free again.
        wait_until(lambda: counters.ingest_bytes == 0, what="the held bytes to be released")
        with raw_connect(host) as again:
            again.sendall(_upload_head(host_world, "second", 4000) + _note(4000))
            assert again.read_response().status == 200
        # Counted under their own reason, not as a full concurrency limit (a black-box test).
        assert (counters.ingest_bytes_rejections, counters.busy_rejections) == (2, 0)
        exposition = host.app.metrics.render().decode()
        assert 'retrieval_host_limit_rejections_total{reason="ingest-bytes"} 2.0' in exposition
        assert 'retrieval_host_limit_rejections_total{reason="busy"} 0.0' in exposition


SHARE_LIMITS = {"maxConcurrency": 4, "maxConcurrencyPerSubject": 2}


def _search(host: RunningHost, world: World, token: str) -> httpx.Response:
    with host.client() as client:
        return client.post(
            "/v1/retrieval/search",
            json={"corpus": CORPUS, "query": "pump"},
            headers={"Authorization": f"Bearer {world.tokens[token]}"},
        )


def test_one_subject_holds_at_most_its_share_of_the_concurrency_limit(host_world: World) -> None:
    # A black-box tester's 16 uploads sending their bodies two bytes a second held every slot
    # for 60 s: every other caller got HOST_BUSY.
    settings = host_world.settings(limits=SHARE_LIMITS)
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        shares = host.app.shares
        with raw_connect(host) as first, raw_connect(host) as second:
            # Two uploads from `alice` whose bodies never come hold her share.
            first.sendall(_upload_head(host_world, "slow-1", 4000, token="alice"))
            second.sendall(_upload_head(host_world, "slow-2", 4000, token="alice"))
            wait_until(lambda: shares.held.get("alice") == 2, what="alice's two slow uploads")
            refused = _search(host, host_world, "alice")
            assert refused.status_code == 503, refused.text
            assert (refused.json()["code"], refused.json()["reason"]) == (
                "HOST_BUSY",
                "subject-busy",
            )
            assert refused.headers["retry-after"] == "1"
            # The ghost token is also `alice`: a subject's share, not a token's.
            assert _search(host, host_world, "ghost").json()["reason"] == "subject-busy"
            # Other subjects keep the rest of the slots.
            assert _search(host, host_world, "admin").status_code == 200
            assert shares.rejections == 2
        # The uploads' clients left: alice's share is free again.
        wait_until(lambda: not shares.held, what="alice's share to be released")
        assert _search(host, host_world, "alice").status_code == 200
        assert host.app.counters.in_flight == 0
        exposition = host.app.metrics.render().decode()
        assert 'retrieval_host_limit_rejections_total{reason="subject-busy"} 2.0' in exposition


def test_a_share_larger_than_the_limit_is_the_limit(host_world: World) -> None:
    settings = host_world.settings(limits={"maxConcurrency": 3, "maxConcurrencyPerSubject": 8})
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        assert host.app.shares.share == 3
    unlimited = host_world.settings(limits={"maxConcurrency": 3})
    with serve_in_thread(unlimited, host_world.driver, host_world.tls) as host:
        assert host.app.shares.share is None

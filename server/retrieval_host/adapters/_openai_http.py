"""HTTP plumbing shared by the OpenAI-compatible adapters (embeddings, chat completions).

Nothing here knows which adapter it serves: failures are built by the caller's own error
factories, so each adapter keeps its error code (`EMBEDDING_FAILED`, `PROVIDER_FAILED`) and its
wording.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import httpx

from retrieval_host.adapters._socket_watchdog import SocketSlot, SocketWatchdog
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason

MAX_ERROR_MESSAGE_CHARS: Final = 200
# The most tokens a service may report for one call: what a usage record's 64-bit column holds.
# A reranker's `total_tokens: 2**70` was echoed by the search and dropped the usage records
# committed with it, other searches' too (probe H, session 40).
MAX_REPORTED_TOKENS: Final = 2**63 - 1
ERROR_BODY_BYTES: Final = 64 * 1024
# Key-shaped runs scrubbed from server messages in addition to the configured key itself; the
# 40-character opaque run matches what `core.descriptor` refuses as a label, so model names pass.
_SECRET_RUN = re.compile(
    r"(?i)\b(?:bearer\s+\S+|(?:sk|pk|rk)-[A-Za-z0-9_\-*.]{6,}|[A-Za-z0-9_\-]{40,})"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def token_count(value: object) -> int | None:
    """`value` as a reported token count: an int (`true` is not one) from 0 to
    `MAX_REPORTED_TOKENS`; None for anything else (each adapter decides what that means)."""
    if type(value) is int and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    return None


ConfigError = Callable[[str], RetrievalError]
# Idle lanes kept for reuse; a burst wider than this closes its extra lanes once done.
MAX_IDLE_LANES: Final = 32
# No connection idle longer is reused, by the lanes (the next call closes a lane idle longer:
# review V found 31 sockets in CLOSE_WAIT after a burst of 40 calls) or by httpx (a lane's
# `keepalive_expiry`). A call is never sent twice, so a connection the service closes as a call
# goes out fails that call (review V: 2-8 of 150 calls near a 5 s keep-alive timeout); 1 s is
# below the idle timeouts of common servers (gunicorn 2 s, uvicorn and Node 5 s, cloud load
# balancers 60 s, nginx 75 s). httpcore also drops a pooled connection whose socket is readable
# (the service's close already arrived): what remains is a close still in flight as the call is
# sent, and a service whose own idle timeout is under 1 s.
LANE_IDLE_S: Final = 1.0


def endpoint_url(base_url: str, path: str, config_error: ConfigError) -> httpx.URL:
    """`base_url` + `path`, refused unless it is a plain http(s) URL without credentials."""
    try:
        url = httpx.URL(base_url.rstrip("/") + path)
    except httpx.InvalidURL:
        raise config_error("base_url is not a valid URL.") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise config_error("base_url must be an http(s) URL.")
    if url.userinfo:
        # Credentials in a URL end up in logs and tracebacks; the key has its own channel.
        raise config_error("base_url must not carry credentials.")
    return url


def tls_verify(
    verify: str | bool | ssl.SSLContext, config_error: ConfigError
) -> bool | ssl.SSLContext:
    """What httpx takes as `verify`; a CA bundle path becomes an `ssl.SSLContext`."""
    if not isinstance(verify, str):
        return verify
    # httpx deprecates a path for `verify`; build the context it asks for.
    try:
        return ssl.create_default_context(cafile=verify)
    except (OSError, ssl.SSLError):
        raise config_error("the CA bundle given as verify cannot be read.") from None


def make_client(
    *,
    timeout: httpx.Timeout,
    verify: bool | ssl.SSLContext,
    headers: Mapping[str, str],
    limits: httpx.Limits | None = None,
) -> httpx.Client:
    """A client that reads nothing from the environment and follows no redirect.

    `trust_env=False`: proxy variables and `.netrc` are ignored, so configuration alone decides
    where a request (and its key) goes; a redirect could carry the key elsewhere.
    """
    return httpx.Client(
        timeout=timeout,
        verify=verify,
        trust_env=False,
        follow_redirects=False,
        headers=dict(headers),
        limits=limits if limits is not None else httpx.Limits(),
    )


class Lane:
    """A client of one kept-alive connection at most, and the slot its watchdogs share."""

    __slots__ = ("client", "returned", "slot")

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.slot = SocketSlot()
        self.returned = 0.0  # when it was last returned (monotonic)


class ClientLanes:
    """`make_client` clients lent to one call at a time, each keeping one connection alive.

    A `SocketWatchdog` must know a call's socket before its first byte arrives, and httpcore
    names a socket only when it connects: a shared pool would not say which kept-alive
    connection a call got, so the earlier adapters made a connection per call (a TLS handshake
    each: an embedding call on loopback took 7.8 ms instead of 3.1). A lane holds one
    connection, which its `SocketSlot` remembers, kept alive for up to `LANE_IDLE_S` (1 s)
    idle. Lanes are made as calls overlap, and at most `MAX_IDLE_LANES` wait for reuse; one TLS
    context serves them all.
    """

    def __init__(
        self, *, timeout: httpx.Timeout, verify: bool | ssl.SSLContext, headers: Mapping[str, str]
    ) -> None:
        if not isinstance(verify, ssl.SSLContext):
            # Built once (loading the CA bundle takes milliseconds), from no environment.
            verify = httpx.create_ssl_context(verify=verify, trust_env=False)
        self._timeout = timeout
        self._verify = verify
        self._headers = dict(headers)
        self._lock = threading.Lock()
        self._idle: list[Lane] = []
        self._closed = False

    @contextlib.contextmanager
    def lane(self) -> Iterator[Lane]:
        """A lane no other call holds until this one returns it."""
        now = time.monotonic()
        with self._lock:
            # Oldest first: the lanes returned before `LANE_IDLE_S` ago are at the start.
            stale = 0
            while stale < len(self._idle) and now - self._idle[stale].returned > LANE_IDLE_S:
                stale += 1
            expired, self._idle = self._idle[:stale], self._idle[stale:]
            lane = self._idle.pop() if self._idle else None
        for old in expired:
            old.client.close()
        if lane is None:
            lane = Lane(
                make_client(
                    timeout=self._timeout,
                    verify=self._verify,
                    headers=self._headers,
                    limits=httpx.Limits(
                        max_connections=1,
                        max_keepalive_connections=1,
                        keepalive_expiry=LANE_IDLE_S,
                    ),
                )
            )
        try:
            yield lane
        finally:
            lane.returned = time.monotonic()
            with self._lock:
                keep = not self._closed and len(self._idle) < MAX_IDLE_LANES
                if keep:
                    self._idle.append(lane)
            if not keep:
                lane.client.close()

    def close(self) -> None:
        """Close the idle lanes; a lane still lent out is closed when it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for lane in idle:
            lane.client.close()


def read_api_key(
    api_key: Callable[[], str] | None, service: str, unavailable: ConfigError
) -> str | None:
    """The key for one request, from its callable; None when the account uses no key.

    A key that cannot be read or is malformed raises `unavailable(detail)`: each adapter's own
    code with its reason `api-key-unavailable`.
    """
    if api_key is None:
        return None
    try:
        key = api_key()
    except Exception:
        raise unavailable(f"the {service} API key could not be read.") from None
    # Reject what would break or split the header; the value itself is never echoed.
    if not isinstance(key, str) or malformed_key(key):
        raise unavailable(f"the {service} API key is empty or malformed.")
    return key


def malformed_key(key: str) -> bool:
    """Whether `key` cannot go in an `Authorization` header: empty, or holding white space or
    a control character."""
    return not key or not key.isprintable() or " " in key


def request_headers(key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def encode_json(body: Mapping[str, Any]) -> bytes:
    """The request body as UTF-8 JSON; text that is not valid Unicode is the caller's error."""
    try:
        return json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot be sent as UTF-8
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "a text is not valid Unicode.",
            reason=InvalidRequestReason.INVALID_TEXT,
        ) from None


def read_capped(
    resp: httpx.Response,
    limit: int,
    *,
    truncate: bool,
    too_large: Callable[[], RetrievalError] | None = None,
    between: Callable[[], None] | None = None,
) -> bytes:
    """At most `limit` bytes of the body: cut there (`truncate`), or raise `too_large()`.
    `between()` is called after every chunk (a deadline, a cancel check)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in resp.iter_bytes():
        if between is not None:
            between()
        size += len(chunk)
        if size > limit:
            if truncate or too_large is None:
                chunks.append(chunk[: limit - size])
                break
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def post_capped(
    lanes: ClientLanes,
    url: httpx.URL,
    *,
    content: bytes,
    headers: Mapping[str, str],
    limit: int,
    too_large: Callable[[], RetrievalError],
    timed_out: Callable[[], RetrievalError],
    unreachable: Callable[[str], RetrievalError],
    total_s: float | None = None,
    cancel: CancelToken | None = None,
) -> tuple[int, bytes]:
    """POST `content` and read the answer: the status and a 200 body of at most `limit` bytes
    (`too_large()` past it), or the start of an error body (it is shown truncated anyway).

    A timeout raises `timed_out()`: the client's own per phase (connect, write, each read),
    or, with `total_s`, a body still arriving `total_s` after the request was sent (a service
    dripping a byte every half second never tripped a per-read timeout: a black-box test
    held a search 197 s). `cancel` is checked between chunks and, while nothing arrives (a
    service computing its answer), by a `SocketWatchdog` that shuts the call's connection (a
    lane's, kept alive otherwise) down once it is cancelled or idle: the token's error is
    raised, not the transport's. The request is sent once, never again: a connection that fails
    before any answer may have carried the whole call to a service that computed (and billed)
    it, new connection or kept-alive one alike (probe B, session 39: a retry had the service
    embed a batch twice, metered as one request). Any transport failure raises
    `unreachable(name)` with the exception's class name only (its text can carry the URL);
    `ClientLanes` reuses no connection idle long enough to meet a service's keep-alive
    timeout."""
    deadline = None if total_s is None else time.monotonic() + total_s

    def between() -> None:
        if cancel is not None:
            cancel.check()
        if deadline is not None and time.monotonic() > deadline:
            raise timed_out()

    with lanes.lane() as lane:
        watchdog = None if cancel is None else SocketWatchdog(cancel, "http-watchdog", lane.slot)
        extensions = {"trace": lane.slot.trace if watchdog is None else watchdog.trace}
        if watchdog is not None:
            watchdog.start()
        try:
            with lane.client.stream(
                "POST", url, content=content, headers=dict(headers), extensions=extensions
            ) as resp:
                status = resp.status_code
                if status != 200:
                    return status, read_capped(
                        resp, ERROR_BODY_BYTES, truncate=True, between=between
                    )
                return status, read_capped(
                    resp, limit, truncate=False, too_large=too_large, between=between
                )
        except httpx.TimeoutException:
            if watchdog is not None:
                watchdog.raise_if_tripped()  # the socket it shut down ended the read
            raise timed_out() from None
        except httpx.HTTPError as exc:
            if watchdog is not None:
                watchdog.raise_if_tripped()
            raise unreachable(type(exc).__name__) from None
        finally:
            if watchdog is not None:
                watchdog.stop()


def scrub(message: str, key: str | None) -> str:
    """Server text made safe for a public detail: one line, no key, bounded."""
    if key:
        message = message.replace(key, "[redacted]")
    message = _SECRET_RUN.sub("[redacted]", message)
    message = _CONTROL.sub(" ", message).strip()
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return message


def error_object(doc: object) -> dict[str, Any]:
    """The `error` object of an OpenAI error body, or {} when there is none."""
    error = doc.get("error") if isinstance(doc, dict) else None
    return error if isinstance(error, dict) else {}


def _error_body(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return error_object(doc)


def error_message(raw: bytes) -> str:
    """The structured `error.message` (unscrubbed, at most 2,000 chars), or ''."""
    message = _error_body(raw).get("message")
    # Only the structured message is shown: an HTML error page or raw body is not.
    return message[:2000] if isinstance(message, str) else ""


def error_param(raw: bytes) -> str | None:
    param = _error_body(raw).get("param")
    return param if isinstance(param, str) else None

"""Limits every route shares: body size, body deadline and the host-wide concurrency limit.

Pure ASGI, so it sees the body as the server delivers it, before any framework buffers it:

- A `Content-Length` over the limit (`maxBodyBytes`; `maxJsonBodyBytes` when smaller, for every
  route but the raw document upload, whose JSON bodies are parsed) is refused before a byte of
  the body is read. Otherwise
  (chunked bodies included) bytes are counted as they are handed to the application, in
  pieces of at most 64 KiB, and the request fails with `PAYLOAD_TOO_LARGE` as soon as the
  count passes the limit, so at most limit + 64 KiB are accepted. The response closes the
  connection so the server stops reading the rest (uvicorn itself holds at most one
  transport read, up to 256 KiB with TLS, beyond what the application took).
- The body must be complete within `bodyTimeoutS` of the request start (408, connection
  closed). The header deadline lives in the server protocol (`serving/server_protocol.py`): no ASGI
  code runs before the headers are complete.
- At most `maxConcurrency` requests are in flight; one more is answered `HOST_BUSY` (503) at
  once, never queued (closing the connection when it announces a body of more than 64 KiB,
  or of unknown length, which it would otherwise read and discard). Raw document uploads
  also share a budget of bytes (`maxIngestBytesInFlight`, at least `maxBodyBytes`): an
  upload whose Content-Length would pass it is answered `HOST_BUSY` (reason `ingest-bytes`)
  before its body is read, and one without a length is counted as it arrives and refused
  (connection closed) the moment it would; its bytes stay counted until its ingest has
  answered. Probes and discovery
  (`/healthz`, `/readyz`, `/v1/protocol`, `/v1/openapi.json`) are exempt: they are cheap, hold
  no worker, and must answer while the host is saturated (a busy host is alive, and a client
  must still be able to discover it).
- With `maxConcurrencyPerSubject`, one subject may hold at most that many of the slots: the
  request policy claims a share when it has authenticated the caller (`SubjectShares`), and
  the subject's next request is answered `HOST_BUSY` (reason `subject-busy`) until one of its
  own ends. The share is released with the slot, when the response (a run's stream included)
  has ended.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import HostBusyReason
from retrieval_host.http.problems import send_problem
from retrieval_host.http.request_id import request_id_of
from retrieval_host.settings import LimitSettings

# The body reaches the application in pieces of at most this size, so a request is refused
# after at most `maxBodyBytes` + 64 KiB accepted, however much the server read in one go.
BODY_PIECE_BYTES: Final = 64 * 1024
EXEMPT_PATHS: Final = frozenset({"/healthz", "/readyz", "/v1/protocol", "/v1/openapi.json"})
# Routes whose body is a raw document, bounded by `maxBodyBytes` alone.
RAW_BODY_PATHS: Final = frozenset({"/v1/retrieval/ingest"})


class RequestTimeout(RetrievalError):
    """The client did not send its request in time (HTTP 408, code `TIMEOUT`)."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.TIMEOUT,
            "The request was not received within the deadline.",
            reason="request-timeout",
        )

    @property
    def status(self) -> int:
        return 408


def payload_too_large(limit: int) -> RetrievalError:
    return RetrievalError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"The request body is larger than {limit} bytes.",
        reason="body-too-large",
    )


def host_busy() -> RetrievalError:
    return RetrievalError(
        ErrorCode.HOST_BUSY, "The host is at its concurrency limit; retry later.", reason="busy"
    )


def ingest_bytes_busy(budget: int) -> RetrievalError:
    return RetrievalError(
        ErrorCode.HOST_BUSY,
        f"Uploads in flight already hold the host's budget of {budget} bytes; retry later.",
        reason=HostBusyReason.INGEST_BYTES,
    )


def subject_busy(share: int) -> RetrievalError:
    return RetrievalError(
        ErrorCode.HOST_BUSY,
        f"This subject already has {share} requests in flight, its share of the host's "
        "concurrency limit; retry when one has ended.",
        reason=HostBusyReason.SUBJECT,
    )


# The scope key of a request's share holder: a list the limits middleware puts in before the
# application runs, and the policy appends the subject to (a holder, so a copied scope shares it).
_SHARE_KEY: Final = "retrieval_host.concurrency_share"


class SubjectShares:
    """How many slots each subject holds, against `maxConcurrencyPerSubject` (event-loop
    owned, like the counters). `claim` is the request policy's, once it knows the subject;
    `release` the limits middleware's, when the request's slot is given back."""

    def __init__(self, limits: LimitSettings) -> None:
        per_subject = limits.max_concurrency_per_subject
        self.share = None if per_subject is None else min(per_subject, limits.max_concurrency)
        self.held: Counter[str] = Counter()
        self.rejections = 0

    def open(self, scope: Scope) -> None:
        """Make room for the request's share (before the application runs)."""
        scope[_SHARE_KEY] = []

    def claim(self, scope: Scope, subject: str) -> None:
        """Count this request for `subject`, or raise `HOST_BUSY` (`subject-busy`)."""
        holder = scope.get(_SHARE_KEY)
        if self.share is None or not isinstance(holder, list) or holder:
            return  # no share configured, a route exempt from the limit, or claimed already
        if self.held[subject] >= self.share:
            self.rejections += 1
            raise subject_busy(self.share)
        self.held[subject] += 1
        holder.append(subject)

    def release(self, scope: Scope) -> None:
        holder = scope.get(_SHARE_KEY)
        if isinstance(holder, list) and holder:
            subject = holder.pop()
            self.held[subject] -= 1
            if self.held[subject] <= 0:
                del self.held[subject]


@dataclass
class LimitCounters:
    """What the limits did, for tests and metrics (event-loop owned: no locking needed)."""

    in_flight: int = 0
    ingest_bytes: int = 0  # raw document bytes the uploads in flight hold
    busy_rejections: int = 0
    # Uploads refused because those in flight hold the byte budget (`ingest-bytes`).
    ingest_bytes_rejections: int = 0
    too_large_rejections: int = 0
    body_timeouts: int = 0
    # Body bytes read from the server for the most recent request refused as too large.
    last_rejected_body_bytes: int = 0
    max_rejected_body_bytes: int = 0


class LimitsMiddleware:
    """Pure ASGI enforcement of `LimitSettings` (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, limits: LimitSettings, shares: SubjectShares | None = None
    ) -> None:
        self.app = app
        self.limits = limits
        self.counters = LimitCounters()
        self.shares = shares if shares is not None else SubjectShares(limits)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        limit = self.limits.max_body_bytes
        if scope["path"] not in RAW_BODY_PATHS:
            limit = min(limit, self.limits.max_json_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            self._record_too_large(0)
            await send_problem(send, payload_too_large(limit), request_id, extra_headers=[_CLOSE])
            return

        exempt = scope["path"] in EXEMPT_PATHS
        upload = scope["path"] in RAW_BODY_PATHS
        reserved = (declared or 0) if upload else 0
        if not exempt:
            if self.counters.in_flight >= self.limits.max_concurrency:
                self.counters.busy_rejections += 1
                headers = [(b"retry-after", b"1")]
                if _large_body(scope, declared):
                    # Kept alive, the server read and discarded the whole refused body (up
                    # to `maxBodyBytes`) before the connection served anything else (probe
                    # "overload", session 44). A small body costs less than a new handshake.
                    headers.append(_CLOSE)
                await send_problem(send, host_busy(), request_id, extra_headers=headers)
                return
            if reserved and self.counters.ingest_bytes + reserved > self._ingest_budget:
                self.counters.ingest_bytes_rejections += 1
                await send_problem(
                    send,
                    ingest_bytes_busy(self._ingest_budget),
                    request_id,
                    extra_headers=[(b"retry-after", b"1"), _CLOSE],
                )
                return
            self.counters.in_flight += 1
            self.counters.ingest_bytes += reserved
            self.shares.open(scope)
        reserve = [reserved]  # what this request holds of the ingest budget
        try:
            await self._limited(scope, receive, send, limit, reserve if upload else None)
        finally:
            if not exempt:
                self.counters.in_flight -= 1
                self.counters.ingest_bytes -= reserve[0]
                self.shares.release(scope)

    @property
    def _ingest_budget(self) -> int:
        return max(self.limits.max_ingest_bytes_in_flight, self.limits.max_body_bytes)

    async def _limited(
        self, scope: Scope, receive: Receive, send: Send, limit: int, reserve: list[int] | None
    ) -> None:
        deadline = time.monotonic() + self.limits.body_timeout_s
        received = 0
        body_done = False
        close_connection = False

        held = b""  # the rest of a server message larger than one piece
        held_more = False

        async def next_piece() -> Message:
            nonlocal held, held_more
            if not held:
                remaining = deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        message = await receive()
                except TimeoutError:
                    raise RequestTimeout() from None
                if message["type"] != "http.request":
                    return message
                held, held_more = message.get("body", b""), message.get("more_body", False)
            piece, held = held[:BODY_PIECE_BYTES], held[BODY_PIECE_BYTES:]
            return {"type": "http.request", "body": piece, "more_body": bool(held) or held_more}

        async def limited_receive() -> Message:
            nonlocal received, body_done, close_connection
            if body_done:
                return await receive()
            try:
                message = await next_piece()
            except RequestTimeout:
                close_connection = True
                self.counters.body_timeouts += 1
                raise
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    close_connection = True
                    self._record_too_large(received)
                    raise payload_too_large(limit)
                if reserve is not None and received > reserve[0]:
                    # An upload without a length (or longer than it said): counted as it comes.
                    more = received - reserve[0]
                    if self.counters.ingest_bytes + more > self._ingest_budget:
                        close_connection = True
                        self.counters.ingest_bytes_rejections += 1
                        raise ingest_bytes_busy(self._ingest_budget)
                    self.counters.ingest_bytes += more
                    reserve[0] = received
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def closing_send(message: Message) -> None:
            # After refusing a body, close the connection: otherwise the server would go on
            # reading (and discarding) the rest of an unbounded upload on a keep-alive socket.
            if message["type"] == "http.response.start" and close_connection:
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        await self.app(scope, limited_receive, closing_send)

    def _record_too_large(self, received: int) -> None:
        self.counters.too_large_rejections += 1
        self.counters.last_rejected_body_bytes = received
        self.counters.max_rejected_body_bytes = max(self.counters.max_rejected_body_bytes, received)


_CLOSE: Final = (b"connection", b"close")


def _large_body(scope: Scope, declared: int | None) -> bool:
    """Whether the request announces a body of more than one piece, or one of unknown length."""
    if declared is not None:
        return declared > BODY_PIECE_BYTES
    return any(key == b"transfer-encoding" for key, _ in scope["headers"])


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

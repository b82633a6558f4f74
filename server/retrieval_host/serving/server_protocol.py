"""uvicorn's httptools protocol with deadlines for the request headers and body, a bound on
the header bytes, and problem bodies for requests it cannot parse.

uvicorn has no header timeout: a client that sends one header byte a second holds its
connection (and a file descriptor) as long as it likes. This subclass arms a timer when the
connection is made, and again when the first byte of a later keep-alive request arrives; the
timer is cancelled when the headers are complete. When it fires the client gets a 408
problem and the connection is closed. Timers run on the event loop, so other connections are
served meanwhile.

The body deadline is enforced where the request runs (`limits.py`, which answers 408). This
class only adds a backstop for bodies nobody reads (a route that answered without reading
them): a message still incomplete shortly after the body deadline closes the connection.
The TLS handshake itself is bounded by the event loop's handshake timeout (60 s).

Neither uvicorn nor httptools bounds the size of a request's header section (only the request
target is, at 64 KiB): httptools buffers a header value until its line ends, so one client
could make the host hold megabytes of header per connection before any ASGI code runs. Here
the bytes fed to the parser while a request's headers are incomplete are counted, and past
`MAX_HEADER_BYTES` the client gets a 431 problem and the connection is closed (at most one
transport read, up to 256 KiB, is taken beyond the bound). Because a whole header section can
arrive within one such read (a black-box tester's 66-160 KB headers were served), a read is
measured before the parser sees it, up to the blank line that ends the head, white space
included (values padded with spaces were served when only parsed values were counted). A head
that follows another request within one read (pipelined) is measured as parsed when complete,
and one over the bound is refused there, before the application sees the request. A request
the parser refuses (malformed framing, a request target over its bound) gets a 400 problem
body with a request id, as every other error does, instead of uvicorn's plain-text line. A
connection that queues more than `MAX_PIPELINED` requests behind the one being answered is
closed. A connection whose writes are paused (its buffers full) and whose client has taken
none of its answer for the body deadline is aborted (`delivery.py`: a client that stopped
reading held its request's concurrency slot for as long as it stayed connected).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, ClassVar, Final

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.http.limits import RequestTimeout
from retrieval_host.http.logs import log_access
from retrieval_host.http.request_id import new_request_id
from retrieval_host.http.strict import InvalidRequest
from retrieval_host.serving.delivery import StallWatch, unsent
from retrieval_host.wire.problems import PROBLEM_MEDIA_TYPE, encode_problem, problem_body

logger = logging.getLogger("retrieval_host.http")
BODY_BACKSTOP_GRACE_S = 0.5
# The request line and headers of one request, in bytes (nginx answers 400 past 32 KiB with its
# defaults, h11 past 16 KiB): room for a long ingest query string (metadata) and many headers.
MAX_HEADER_BYTES: Final = 64 * 1024
# While shutting down, how often a connection with an answer in flight checks it has ended.
DROP_POLL_S: Final = 0.05
# Requests one connection may queue behind the one being answered (HTTP/1.1 pipelining). uvicorn
# queues them without bound: it pauses reading only after the transport read that held them,
# up to 256 KiB of 35-byte requests, and resumes at every answer, so one client that never read
# its answers made a host hold 2.7 GB in 30 s (a black-box test). Clients that pipeline at all
# (browsers and httpx do not) keep a few requests in flight.
MAX_PIPELINED: Final = 16

_STATUS_LINES: Final = {
    400: b"HTTP/1.1 400 Bad Request\r\n",
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
}


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop a request whose header section is too large."""


class _NotHttp11(Exception):
    """Raised from a parser callback for a request RFC 9112 says a server must refuse."""


def _host_problem(version: str, url: bytes, headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a parsed request line and headers are not a request to serve (None: they are).
    RFC 9112: an HTTP/1.1 request has exactly one Host (3.2), and an absolute-form target's
    authority is the host it addresses (3.2.2): a `Host` that names another let a request for
    `https://evil.example/...` past `allowedHosts` (a black-box test). HTTP/0.9 request lines
    (no version) were served too. A Host is `name[:port]` (RFC 9110 7.2), a target's
    authority has no userinfo (4.2.4: `https://127.0.0.1:x@evil.example/` read as this host),
    and its scheme is http or https; a target and a Host that name one host and port (the
    scheme's default when none is written, as a proxy may leave it out) agree."""
    if version not in ("1.0", "1.1"):
        return "version"
    hosts = [value.strip() for name, value in headers if name.lower() == b"host"]
    if len(hosts) > 1 or (version == "1.1" and not hosts):
        return "host"
    if hosts and hosts[0] and _host_and_port(hosts[0], b"") is None:
        return "host"
    scheme = _ABSOLUTE_FORM.match(url)
    if scheme is None:
        return None
    name = scheme.group(1).lower()
    if name not in (b"http", b"https"):
        return "scheme"
    authority = re.split(rb"[/?#]", url[scheme.end() :], maxsplit=1)[0]
    target = _host_and_port(authority, name)
    if target is None or not hosts or target != _host_and_port(hosts[0], name):
        return "absolute-form"
    return None


_ABSOLUTE_FORM: Final = re.compile(rb"([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST: Final = re.compile(rb"(\[[0-9A-Fa-f:.]+\]|[^\[\]@:/?#\s]+)(?::([0-9]*))?")


def _host_and_port(value: bytes, scheme: bytes) -> tuple[bytes, bytes] | None:
    """(host lower-cased, port: the scheme's default when none is written), or None when
    `value` is not `host[:port]`."""
    match = _HOST.fullmatch(value)
    if match is None:
        return None
    default = b"443" if scheme == b"https" else b"80" if scheme == b"http" else b""
    return match.group(1).lower(), match.group(2) or default


class _PipelineTooDeep(Exception):
    """Raised from a parser callback to stop a connection queueing too many requests."""


def _head_size(method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The request line and header lines as sent, less optional white space: `METHOD url
    HTTP/1.1`, each `name: value`, their line ends and the blank line. (A black-box test: a
    method counted as four letters refused a GET one byte short of the bound.)"""
    line = len(method) + 1 + len(url) + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in headers) + 2


def _head_part(tail: bytes, data: bytes) -> int:
    """How many bytes of `data` belong to a request head being read: up to the blank line that
    ends it (found across `tail`, the end of the previous read), or all of them. Counted as
    sent, optional white space included, before the parser strips it."""
    seen = tail + data
    ends = [at + len(end) for end in (b"\n\r\n", b"\n\n") if (at := seen.find(end)) >= 0]
    return max(0, min(ends) - len(tail)) if ends else len(data)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that cuts off clients too slow to send their requests, or to take
    their answers."""

    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 60.0
    # Connections cut off, for tests and metrics.
    header_timeouts: ClassVar[int] = 0
    body_timeouts: ClassVar[int] = 0
    headers_too_large: ClassVar[int] = 0
    pipelines_too_deep: ClassVar[int] = 0
    bad_requests: ClassVar[int] = 0
    stalled_readers: ClassVar[int] = 0

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # Bytes fed to the parser since the current request's headers began (None: complete).
        self._head_bytes: int | None = 0
        self._oversized_head = False  # the complete header section measured over the bound
        self._head_tail = b""  # the last bytes read, for a head's end split between reads
        self._completed = 0  # requests whose message (head and body) the parser has read
        self._began = self.loop.time()  # of the connection, then of each request's first byte
        self._pipeline_overflow = False
        # A problem to answer once the requests ahead of it have their answers (pipelining).
        self._deferred: tuple[RetrievalError, str] | None = None
        self._reading_body = False  # whether the parser is in the body of `self.cycle`
        self._unanswered = 0  # requests parsed (running or queued) whose answer has not ended
        self._drop_timer: asyncio.TimerHandle | None = None  # shutting down: see `shutdown`
        self._lost = False
        # A client that takes nothing of its answer for `body_timeout_s` ("data taken too
        # slowly", the mirror of the body deadline) is cut off: see `delivery.py`.
        self._stall_watch = StallWatch(self.loop, self.body_timeout_s, self._reader_stalled)

    @classmethod
    def with_timeouts(cls, header_s: float, body_s: float) -> type[HeaderDeadlineProtocol]:
        """A subclass bound to these deadlines (uvicorn instantiates the class it is given)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "header_timeout_s": header_s,
                "body_timeout_s": body_s,
                "header_timeouts": 0,
                "body_timeouts": 0,
                "headers_too_large": 0,
                "pipelines_too_deep": 0,
                "bad_requests": 0,
                "stalled_readers": 0,
            },
        )

    @classmethod
    def rejections(cls) -> dict[str, int]:
        """What the connections refused before any application code ran, by the reason the
        problem body gives (the metrics' `limit_rejections`)."""
        return {
            "header-timeout": cls.header_timeouts,
            "headers-too-large": cls.headers_too_large,
            "bad-http": cls.bad_requests,
            "pipeline-too-deep": cls.pipelines_too_deep,
            "stalled-reader": cls.stalled_readers,
        }

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._deferred is not None:
            return  # the parser stopped at a bad request; its answer waits for those ahead
        # Bytes of the current head already read (a new request's, 0, between requests).
        before = self._head_bytes
        if before is None and not self._reading_body:
            before = 0
        if before is not None and before + _head_part(self._head_tail, data) > MAX_HEADER_BYTES:
            self._refuse_oversized_head()
            return
        self._head_tail = data[-2:]
        counting = before is not None
        completed = self._completed
        super().data_received(data)
        # Counted after feeding: the headers may have completed within this piece. A head that
        # began after another request ended within this piece (pipelined) is not charged that
        # request's bytes (a 62 KB head behind a POST was refused): where it began is not
        # known, so this piece is left out, and its parsed size is measured when complete.
        if (
            counting
            and self._head_bytes is not None
            and self._completed == completed
            and not self.transport.is_closing()
        ):
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse_oversized_head()

    def _refuse_oversized_head(self) -> None:
        type(self).headers_too_large += 1
        self._disarm_header_deadline()
        self._send_problem(
            InvalidRequest(
                f"The request line and headers are larger than {MAX_HEADER_BYTES} bytes.",
                status=431,
                reason=InvalidRequestReason.HEADERS_TOO_LARGE,
            ),
            "request headers too large",
        )

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request the parser refuses (its `msg` names no input).
        if self._pipeline_overflow:
            # No answer can be written out of turn: the requests ahead have theirs to come.
            type(self).pipelines_too_deep += 1
            # No request is answered, so no access line: a warning that says whose it was.
            logger.warning(
                "more than %d pipelined requests queued on one connection; closing it",
                MAX_PIPELINED,
                extra={
                    "fields": {
                        "reason": "pipeline-too-deep",
                        "client": self.client[0] if self.client else None,
                    }
                },
            )
            self.transport.close()
            return
        if self._oversized_head:
            self._refuse_oversized_head()
            return
        type(self).bad_requests += 1
        self._send_problem(
            InvalidRequest(
                "The request is not valid HTTP/1.1.",
                status=400,
                reason=InvalidRequestReason.BAD_HTTP,
            ),
            "invalid HTTP request",
        )

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._began = self.loop.time()
        super().on_message_begin()
        # The first request's deadline runs from the connection; later keep-alive requests'
        # from their first byte (idle time before it is uvicorn's keep-alive timeout).
        if self._header_timer is None:
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        if (
            self._head_bytes is not None
            and _head_size(self.parser.get_method(), self.url, self.headers) > MAX_HEADER_BYTES
        ):
            self._oversized_head = True
            # httptools turns this into an HttpParserError; uvicorn then calls
            # send_400_response, which answers the 431.
            raise _HeadTooLarge
        if _host_problem(self.parser.get_http_version(), self.url, self.headers) is not None:
            raise _NotHttp11  # answered as any request the parser refuses: 400 bad-http
        if len(self.pipeline) >= MAX_PIPELINED:
            self._pipeline_overflow = True
            raise _PipelineTooDeep  # stops the parser within this read, as above
        self._head_bytes = None
        self._disarm_header_deadline()
        super().on_headers_complete()
        self._unanswered += 1
        self._reading_body = True  # of `self.cycle`, until its message completes
        self._disarm_body_deadline()
        # A little after the application's own body deadline, which answers first if the
        # application is reading.
        self._body_timer = self.loop.call_later(
            self.body_timeout_s + BODY_BACKSTOP_GRACE_S, self._body_too_slow
        )

    def on_message_complete(self) -> None:
        self._completed += 1
        self._disarm_body_deadline()
        self._reading_body = False
        super().on_message_complete()

    def shutdown(self) -> None:
        # Once a connection has nothing in flight and its client has received every byte, it
        # is dropped. A polite TLS close waits for the client's close_notify, which a pooled
        # client sends only when it next touches the connection and a client holding its
        # socket never: each such connection held the stop for the whole `shutdownGraceS`
        # (black-box tests: 25 s for an idle keep-alive connection, and for a request answered
        # 1.2 s in). Delivered means acknowledged: an answer still queued for a slow reader
        # (in the TLS layer, the transport under it or the kernel) is left to finish within
        # the grace (dropping it at the TLS layer's empty buffer cut a 7 MB listing at 3 MB).
        super().shutdown()  # a polite close, or no keep-alive after the answer in flight
        self._drop_timer = self.loop.call_later(DROP_POLL_S, self._poll_drop, False)

    def _idle(self) -> bool:
        """Nothing in flight or queued, and nothing written that the client has not received."""
        done = self.cycle is None or self.cycle.response_complete
        return done and not self.pipeline and not unsent(self.transport)

    def _poll_drop(self, idle_before: bool) -> None:
        # Dropped after two quiet looks a poll apart: between them the loop has run, so bytes
        # the transport under TLS still held have reached the kernel's count.
        self._drop_timer = None
        if self._lost:
            return
        idle = self._idle()
        if idle and idle_before:
            self.transport.abort()
            return
        self._drop_timer = self.loop.call_later(DROP_POLL_S, self._poll_drop, idle)

    def pause_writing(self) -> None:
        super().pause_writing()  # the application's next `send` waits for the client
        if not self._lost:
            self._stall_watch.start(self.transport)

    def resume_writing(self) -> None:
        self._stall_watch.stop()
        super().resume_writing()

    def _reader_stalled(self) -> None:
        # Aborted, not closed: a polite close would wait for the same client to take the
        # buffered bytes. The application's pending `send` returns as for a client gone (a
        # run is cancelled), so its slot is freed.
        type(self).stalled_readers += 1
        cycle = self.cycle
        logger.warning(
            "client took none of its answer for %s s; closing the connection",
            self.body_timeout_s,
            extra={
                "fields": {
                    "reason": "stalled-reader",
                    "client": self.client[0] if self.client else None,
                    "path": cycle.scope["path"] if cycle is not None else None,
                    "unsentBytes": unsent(self.transport),
                }
            },
        )
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._stall_watch.stop()
        if self._drop_timer is not None:
            self._drop_timer.cancel()
            self._drop_timer = None
        self._disarm_header_deadline()
        self._disarm_body_deadline()
        super().connection_lost(exc)

    def _disarm_body_deadline(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_too_slow(self) -> None:
        self._body_timer = None
        if not self.transport.is_closing():
            type(self).body_timeouts += 1
            logger.info("request body not received in time; closing the connection")
            self.transport.close()

    def _arm_header_deadline(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        type(self).header_timeouts += 1
        self._send_problem(RequestTimeout(), "request headers not received in time")

    def _send_problem(self, error: RetrievalError, message: str) -> None:
        """Answer `error` as a problem and close the connection, once the requests ahead of it
        on this connection (pipelined) have their answers: written at once, a bad request
        behind a run was read as the run's answer, and the run was cancelled (a black-box
        test). Until then nothing more is read: the parser stopped at the bad request."""
        if self._deferred is not None:
            return  # one problem per connection: it is answered, then the connection closes
        if self._reading_body and self.cycle is not None:
            # The body of the newest request broke: that request is never run (it was queued)
            # or was already running, and the problem is its own answer (a second black-box
            # test: deferred behind the request itself, it waited out the body deadline).
            failing = self.cycle
            queued = len(self.pipeline)
            self.pipeline = type(self.pipeline)(e for e in self.pipeline if e[0] is not failing)
            if len(self.pipeline) == queued:  # it was running: nothing is ahead of it
                if failing.response_complete:
                    self.transport.close()  # answered already (early, as a 401): no second one
                    return
                self._answer_problem(error, message)
                return
            self._unanswered -= 1  # never run: it is not one the problem waits for
        if self._unanswered > 0:
            self._deferred = (error, message)
            self._disarm_header_deadline()  # the headers came: no timeout to count as well
            self.flow.pause_reading()
            return
        self._answer_problem(error, message)

    def on_response_complete(self) -> None:
        self._unanswered -= 1
        super().on_response_complete()
        if self._deferred is not None and self._unanswered <= 0:
            error, message = self._deferred
            self._deferred = None
            self._answer_problem(error, message)

    def _answer_problem(self, error: RetrievalError, message: str) -> None:
        """Write `error` as a problem (with a new request id) and close the connection."""
        request_id = new_request_id()
        logger.info(message, extra={"request_id": request_id})
        status = error.status
        body = encode_problem(
            problem_body(error.code, error.detail, request_id, status=status, reason=error.reason)
        )
        head = (
            _STATUS_LINES[status] + b"content-type: " + PROBLEM_MEDIA_TYPE.encode("ascii") + b"\r\n"
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
            b"x-request-id: " + request_id.encode("ascii") + b"\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.write(head + body)
        self.transport.close()
        # The access line every request gets (the application never saw this one), with the
        # code and reason its problem body gives, and how long the connection held it.
        log_access(
            request_id=request_id,
            method="OTHER",
            route="-",
            status=status,
            duration_s=self.loop.time() - self._began,
            response_bytes=len(body),
            subject=None,
            client=self.client[0] if self.client else None,
            problem=(error.code.value, error.reason),
        )

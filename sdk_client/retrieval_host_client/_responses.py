"""Reading what the host sends back, without I/O: answers become models or typed errors.

A non-2xx answer becomes the error its problem `code` names; a 2xx answer is validated into
its response model and then checked against the request (hits of the asked corpus, a run's
manifest citing only returned hits); a streamed run's bytes become ordered, typed events
(`RunEventReader`); an httpx failure becomes the connection branch of the errors. The request
side (`_base`) picks the parser and check of each call; the shells feed the bytes in.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from retrieval_host_client._errors import (
    APIStatusError,
    ProtocolError,
    RetrievalHostConnectionError,
    RetrievalHostError,
    RetrievalHostTimeoutError,
    bounded_retry_after,
    error_from_problem,
    error_from_status,
)
from retrieval_host_client._sse import ServerSentEvent, SSEDecoder, SSEError
from retrieval_host_client.models import (
    CorporaResponse,
    CorpusInfo,
    DeleteResponse,
    IndexResponse,
    PassageResponse,
    Problem,
    SearchRequest,
    SearchResponse,
    SourceResponse,
    SourcesResponse,
)
from retrieval_host_client.run_models import (
    RunCompletedEvent,
    RunDeltaEvent,
    RunEvent,
    RunFailedEvent,
    RunProgressEvent,
    RunRecord,
    RunResult,
    RunStartedEvent,
)

__all__ = [
    "EVENT_STREAM",
    "MAX_BODY_BYTES",
    "MAX_ERROR_BODY_BYTES",
    "BodyReader",
    "RunEventReader",
    "check_event_stream",
    "check_page",
    "check_passage",
    "check_run_record",
    "check_run_result",
    "check_same_source",
    "check_search_response",
    "check_source",
    "corpora_of",
    "error_for",
    "is_event_stream",
    "next_cursor",
    "parser",
    "raise_for_status",
    "retry_after_seconds",
    "stream_error",
    "transport_error",
]

EVENT_STREAM: Final = "text/event-stream"

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""The most a successful answer that is not a stream may hold, decoded: more is refused with
`ProtocolError` (probe C, session 40: a body read whole, with no bound, let an endless or
decompressed-bomb answer grow the client to gigabytes). Far above what the host answers: 100
search hits of 16 KiB passages (the default passage bound) are under 2 MiB."""

MAX_ERROR_BODY_BYTES: Final = 1024 * 1024
"""The most of an error answer's body the client reads: a problem document is a few hundred
bytes. A longer body is cut there and the rest is not read (the connection is not reused);
cut, it is no valid problem document, so the error is typed by its HTTP status."""

R = TypeVar("R", bound=BaseModel)


# --- bodies read whole ------------------------------------------------------------------------


class BodyReader:
    """The body of an answer that is not a stream, collected chunk by chunk under its bound.

    A 2xx body over `MAX_BODY_BYTES` (declared in `Content-Length`, or as it arrives) raises
    `ProtocolError`; an error body is kept up to `MAX_ERROR_BODY_BYTES` and `feed` then says
    to stop reading. The shells feed it the decoded chunks and close the response after.
    """

    def __init__(self, status: int, headers: httpx.Headers) -> None:
        self._ok = 200 <= status < 300
        self._limit = MAX_BODY_BYTES if self._ok else MAX_ERROR_BODY_BYTES
        self._parts: list[bytes] = []
        self._size = 0
        declared = headers.get("content-length", "")
        if self._ok and declared.isascii() and declared.isdigit() and int(declared) > self._limit:
            raise self._too_large()

    def _too_large(self) -> ProtocolError:
        return ProtocolError(f"the host's answer is larger than {self._limit} bytes")

    def feed(self, chunk: bytes) -> bool:
        """Add a chunk of the body; True when an error body is cut and reading should stop
        (a 2xx body exactly at its bound is read on: only a byte past it is refused)."""
        room = self._limit - self._size
        if len(chunk) > room:
            if self._ok:
                raise self._too_large()
            chunk = chunk[:room]
        self._parts.append(chunk)
        self._size += len(chunk)
        return not self._ok and self._size >= self._limit

    def body(self) -> bytes:
        """The bytes collected so far."""
        return b"".join(self._parts)


# --- answers to models or typed errors --------------------------------------------------------


def raise_for_status(status: int, headers: httpx.Headers, body: bytes) -> None:
    """Raise the typed error of a non-2xx answer (a problem document or a bare status)."""
    if 200 <= status < 300:
        return
    raise error_for(status, headers, body)


def error_for(status: int, headers: httpx.Headers, body: bytes) -> APIStatusError:
    """The typed error of a non-2xx answer."""
    retry_after = retry_after_seconds(headers.get("retry-after"))
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type in ("application/problem+json", "application/json"):
        try:
            problem = Problem.model_validate_json(body)
        except ValidationError:
            pass
        else:
            return error_from_problem(problem, status=status, retry_after=retry_after)
    return error_from_status(
        status, request_id=headers.get("x-request-id"), retry_after=retry_after
    )


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A `Retry-After` header in seconds from now (RFC 9110 §10.2.3: delay-seconds or an
    HTTP date), at most a day (`MAX_RETRY_AFTER_S`); None when absent or unreadable, 0 for a
    date in the past. `now`: seconds since the epoch (default: the clock)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # `isdigit` alone takes `²` and other digits
        return bounded_retry_after(float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None  # RFC 9110 dates are GMT; one without a zone is not one
    current = time.time() if now is None else now
    return bounded_retry_after(max(0.0, when.timestamp() - current))


def parser(
    model: type[R], check: Callable[[R], R] | None = None
) -> Callable[[int, httpx.Headers, bytes], R]:
    def parse(status: int, headers: httpx.Headers, body: bytes) -> R:
        raise_for_status(status, headers, body)
        try:
            value = model.model_validate_json(body)
        except ValidationError as exc:
            raise ProtocolError(
                f"the host's answer is not a valid {model.__name__}: {_errors_of(exc)}"
            ) from None
        return check(value) if check is not None else value

    return parse


def _errors_of(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_input=False, include_url=False)[:3]:
        loc = ".".join(str(p) for p in error["loc"])
        parts.append(f"{loc or '(body)'}: {error['msg']}")
    return "; ".join(parts)


# --- validation of what is received -----------------------------------------------------------


def check_search_response(request: SearchRequest) -> Callable[[SearchResponse], SearchResponse]:
    """Hits are unique, within `limit`, of the asked corpus and of the asked sources."""

    def check(response: SearchResponse) -> SearchResponse:
        if len(response.hits) > request.limit:
            raise ProtocolError(f"{len(response.hits)} hits exceed the limit {request.limit}")
        seen: set[str] = set()
        allowed = set(request.source_ids) if request.source_ids is not None else None
        for hit in response.hits:
            if hit.chunk_id in seen:
                raise ProtocolError(f"the hit {hit.chunk_id!r} is returned twice")
            seen.add(hit.chunk_id)
            if hit.scope.corpus != request.corpus:
                raise ProtocolError(f"the hit {hit.chunk_id!r} is from another corpus")
            if allowed is not None and hit.source.id not in allowed:
                raise ProtocolError(f"the hit {hit.chunk_id!r} is from a source not asked for")
        return response

    return check


def check_same_source(
    corpus: str, source_id: str
) -> Callable[[IndexResponse | DeleteResponse], Any]:
    def check(response: IndexResponse | DeleteResponse) -> IndexResponse | DeleteResponse:
        if response.corpus != corpus or response.source.id != source_id:
            raise ProtocolError("the host answered about another corpus or source")
        return response

    return check


def check_run_result(result: RunResult) -> RunResult:
    """A completed run's manifest references only hits its retrievals returned.

    Manifest ids are unique; each is among the `sourceIds` of the run's receipts (the hits
    its retrievals returned); the output artifact's `sourceIds` are manifest ids.
    """
    returned = {chunk_id for receipt in result.receipts for chunk_id in receipt.source_ids}
    manifest: set[str] = set()
    for entry in result.sources:
        if entry.id in manifest:
            raise ProtocolError(f"the manifest lists {entry.id!r} twice")
        if entry.id not in returned:
            raise ProtocolError(f"the manifest entry {entry.id!r} references no returned hit")
        manifest.add(entry.id)
    if result.artifact is not None:
        unknown = [i for i in result.artifact.source_ids if i not in manifest]
        if unknown:
            raise ProtocolError(f"the output artifact cites {unknown[0]!r}, not in the manifest")
    return result


def check_run_record(run_id: str) -> Callable[[RunRecord], RunRecord]:
    def check(record: RunRecord) -> RunRecord:
        if record.run_id != run_id:
            raise ProtocolError(f"asked for run {run_id!r}, got {record.run_id!r}")
        if record.result is not None:
            if record.result.run_id != run_id:
                raise ProtocolError("the recorded result belongs to another run")
            check_run_result(record.result)
        return record

    return check


# --- inspection answers ----------------------------------------------------------------------

P = TypeVar("P", SourcesResponse, SourceResponse)


def check_page(cursor: str | None) -> Callable[[P], P]:
    """A page must move on: a `nextCursor` equal to the one sent would page forever."""

    def check(response: P) -> P:
        if cursor is not None and response.next_cursor == cursor:
            raise ProtocolError("the host returned the same cursor again")
        return response

    return check


def next_cursor(page: SourcesResponse, followed: set[str]) -> str | None:
    """The cursor of a listing's next page, None at its end; `followed` holds the cursors this
    walk has sent (the first one included) and gets this one. A cursor sent before would page
    forever (probe C, session 40: a host cycling A, B, A kept a listing going), so it raises
    `ProtocolError`; the set grows by one cursor per page walked."""
    cursor = page.next_cursor
    if cursor is None:
        return None
    if cursor in followed:
        raise ProtocolError("the host returned a cursor of an earlier page again")
    followed.add(cursor)
    return cursor


def check_source(source_id: str, cursor: str | None) -> Callable[[SourceResponse], SourceResponse]:
    """The answer is about the asked source, and its page of passages moves on."""
    same_page = check_page(cursor)

    def check(response: SourceResponse) -> SourceResponse:
        if response.source.id != source_id:
            raise ProtocolError("the host answered for another source than asked")
        return same_page(response)

    return check


def check_passage(
    corpus: str, chunk_id: str, revision: str | None = None
) -> Callable[[PassageResponse], PassageResponse]:
    """The answer is the asked passage, in the asked corpus (at the asked revision)."""

    def check(response: PassageResponse) -> PassageResponse:
        if response.chunk_id != chunk_id or response.scope.corpus != corpus:
            raise ProtocolError("the host answered for another passage than asked")
        if revision is not None and response.source.revision != revision:
            raise ProtocolError("the host answered with another revision than asked")
        return response

    return check


def corpora_of(response: CorporaResponse) -> list[CorpusInfo]:
    """The corpora of a listing, as a list the caller owns."""
    return list(response.corpora)


# --- streamed runs ----------------------------------------------------------------------------

_EventModel: TypeAlias = (
    type[RunStartedEvent]
    | type[RunProgressEvent]
    | type[RunDeltaEvent]
    | type[RunCompletedEvent]
    | type[RunFailedEvent]
)
_EVENT_MODELS: Final[Mapping[str, _EventModel]] = {
    "run.started": RunStartedEvent,
    "run.progress": RunProgressEvent,
    "run.delta": RunDeltaEvent,
    "run.completed": RunCompletedEvent,
    "run.failed": RunFailedEvent,
}


def _run_event(sse: ServerSentEvent) -> RunEvent | None:
    model = _EVENT_MODELS.get(sse.event)
    if model is None:
        return None  # an event type this client does not know yet: skipped, not an error
    try:
        return model.model_validate_json(sse.data)
    except ValidationError as exc:
        if sse.event == "run.progress" and any(e["loc"] == ("phase",) for e in exc.errors()):
            raise ProtocolError("a run.progress event without its phase") from None
        raise ProtocolError(f"a malformed {sse.event} event: {_errors_of(exc)}") from None


class RunEventReader:
    """Turns the bytes of a `run` event stream into validated, typed events.

    Order: `run.started` opens the run (a `run.failed` may come alone when the run never
    started); `run.completed` or `run.failed` ends it. A completed result must be of the
    started run and pass `check_run_result`. Heartbeat comments and event types this client
    does not know are skipped. Nothing after the terminal event is read as an event, in the
    same chunk or a later one: the terminal event is the answer (probe C, session 40: an
    event after it was refused when it arrived in the same read, and dropped in a later one).
    """

    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self.run_id: str | None = None
        self.result: RunResult | None = None
        self.failure: RunFailedEvent | None = None

    @property
    def finished(self) -> bool:
        """Whether the terminal event (completed or failed) has been read."""
        return self.result is not None or self.failure is not None

    def feed(self, chunk: bytes) -> list[RunEvent]:
        """Decode a chunk of the response body; return the complete events in it."""
        try:
            decoded = self._decoder.feed(chunk)
        except SSEError as exc:
            raise ProtocolError(str(exc)) from None
        events: list[RunEvent] = []
        for sse in decoded:
            if self.finished:
                break
            event = _run_event(sse)
            if event is None:
                continue
            self._accept(event)
            events.append(event)
        return events

    def _accept(self, event: RunEvent) -> None:
        if isinstance(event, RunStartedEvent):
            if self.run_id is not None:
                raise ProtocolError("a second run.started event")
            self.run_id = event.run_id
            return
        if isinstance(event, RunFailedEvent):
            if self.run_id is not None and event.run_id not in (None, self.run_id):
                raise ProtocolError("a run.failed event of another run")
            self.failure = event
            return
        if self.run_id is None:
            raise ProtocolError(f"a {event.type} event before run.started")
        if isinstance(event, RunCompletedEvent):
            if event.result.run_id != self.run_id:
                raise ProtocolError("a run.completed event of another run")
            self.result = check_run_result(event.result)

    def end(self) -> None:
        """The body ended: raise `ProtocolError` unless the run's terminal event was read."""
        truncated = self._decoder.end()
        if not self.finished:
            what = "in the middle of an event" if truncated else "before the run ended"
            raise ProtocolError(f"the event stream stopped {what}")

    def outcome(self) -> RunResult:
        """The completed result, or the typed error of the failed run."""
        if self.result is not None:
            return self.result
        if self.failure is not None:
            raise error_from_problem(self.failure.problem)
        raise ProtocolError("the run has not ended")


def stream_error(status: int, headers: httpx.Headers, body: bytes) -> APIStatusError:
    """The typed error of a `stream_run` request the host refused before streaming."""
    return error_for(status, headers, body)


def is_event_stream(response: httpx.Response) -> bool:
    """A successful answer that is an event stream (anything else is read whole and parsed)."""
    media_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return 200 <= response.status_code < 300 and media_type == EVENT_STREAM


def check_event_stream(headers: httpx.Headers) -> None:
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != EVENT_STREAM:
        raise ProtocolError(f"expected an event stream, got {media_type or 'no content type'}")


# --- transport errors -------------------------------------------------------------------------


def transport_error(exc: httpx.RequestError) -> RetrievalHostError:
    """The client error for an httpx request failure (the cause stays chained): the
    connection branch for transport failures, `ProtocolError` for an undecodable body."""
    if not isinstance(exc, httpx.TransportError):
        return ProtocolError(f"the host's answer could not be read: {type(exc).__name__}")
    # Nothing left the client when it could not connect, or waited in vain for a pooled
    # connection.
    sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    if isinstance(exc, httpx.TimeoutException):
        return RetrievalHostTimeoutError(
            f"timed out: {type(exc).__name__} ({exc})", request_sent=sent
        )
    return RetrievalHostConnectionError(
        f"connection failed: {type(exc).__name__} ({exc})", request_sent=sent
    )

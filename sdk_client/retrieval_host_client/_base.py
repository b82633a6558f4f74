"""Everything both clients share, without I/O: options, requests, responses, validation.

`Client` and `AsyncClient` only send what a `Call` describes, read the response and hand the
bytes back to `Call.parse`; streamed runs feed their bytes to one `RunEventReader`. So the
rules (what is sent, which error a problem becomes, what a valid answer looks like) exist
once, and the two shells cannot drift apart.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Generic, Literal, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from retrieval_host_client._errors import (
    APIStatusError,
    ProtocolError,
    RetrievalHostConnectionError,
    RetrievalHostError,
    RetrievalHostTimeoutError,
    error_from_problem,
    error_from_status,
)
from retrieval_host_client._sse import ServerSentEvent, SSEDecoder, SSEError
from retrieval_host_client.models import (
    CorporaResponse,
    CorpusInfo,
    DeleteRequest,
    DeleteResponse,
    IndexRequest,
    IndexResponse,
    IngestParams,
    PageParams,
    PassageResponse,
    Problem,
    ProtocolInfo,
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
    RunRequest,
    RunResult,
    RunStartedEvent,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "TOKEN_ENV",
    "BaseClient",
    "Call",
    "DocumentInput",
    "RunEventReader",
    "TimeoutTypes",
    "Upload",
    "check_run_result",
    "check_search_response",
    "transport_error",
]

TOKEN_ENV: Final = "RETRIEVAL_HOST_TOKEN"  # noqa: S105 - a variable name, not a secret
DEFAULT_TIMEOUT: Final = 30.0
UPLOAD_CHUNK_BYTES: Final = 64 * 1024
CLIENT_VERSION: Final = "0.1.0"
USER_AGENT: Final = f"retrieval-host-client/{CLIENT_VERSION} httpx/{httpx.__version__}"

JSON_TYPES: Final = "application/json, application/problem+json"
EVENT_STREAM: Final = "text/event-stream"

# RFC 6750 b64token: what a bearer token may contain (the host issues `rh_` + base64url).
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")

_SUFFIX_MEDIA_TYPES: Final[Mapping[str, str]] = {
    ".pdf": "application/pdf",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".eml": "message/rfc822",
    ".mbox": "application/mbox",
}

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
TimeoutTypes: TypeAlias = float | httpx.Timeout | None
DocumentInput: TypeAlias = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


# --- options ----------------------------------------------------------------------------------


def resolve_token(token: str | None, environ: Mapping[str, str]) -> str | None:
    """The token argument, else `RETRIEVAL_HOST_TOKEN`, checked (its value is never echoed)."""
    value = token if token is not None else environ.get(TOKEN_ENV)
    if value is None or value == "":
        return None
    if not _BEARER_TOKEN.fullmatch(value):
        where = "the token argument" if token is not None else TOKEN_ENV
        raise ValueError(
            f"{where} is not a bearer token (whitespace or a newline read from a file must be "
            "stripped first)"
        )
    return value


def check_base_url(base_url: str | httpx.URL) -> httpx.URL:
    """An https URL; plain http only to a loopback address (a local TLS-terminating proxy)."""
    url = httpx.URL(str(base_url))
    if url.userinfo:
        raise ValueError("base_url must not carry credentials; pass token= instead")
    if url.scheme == "https":
        return url
    if url.scheme == "http" and _is_loopback(url.host):
        return url
    raise ValueError(
        f"base_url must be https:// (plain http only to a loopback address), got {url.scheme!r}"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssl_verify(ca_bundle: str | os.PathLike[str] | ssl.SSLContext | None) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: the system's default (True), or a context that
    trusts the given PEM bundle (certificate checks and hostname checks stay on)."""
    if ca_bundle is None:
        return True
    if isinstance(ca_bundle, ssl.SSLContext):
        return ca_bundle
    context = ssl.create_default_context(cafile=os.fspath(ca_bundle))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _timeout(timeout: TimeoutTypes) -> httpx.Timeout:
    return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)


# --- calls ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upload:
    """A raw document to send as a request body, opened only while the request is sent.

    A path is read in chunks of 64 KiB (never whole into memory) and sent with its
    `Content-Length`; a file object is read in chunks from its current position and sent
    chunked (it is not closed); bytes are sent as they are.
    """

    source: DocumentInput
    media_type: str

    @contextlib.contextmanager
    def opened(self) -> Iterator[tuple[bytes | Callable[[int], bytes], int | None]]:
        """Yield `(bytes, length)` or `(read(n), length-or-None)` for the body."""
        source = self.source
        if isinstance(source, bytes | bytearray | memoryview):
            yield bytes(source), len(source)
        elif isinstance(source, str | os.PathLike):
            with open(source, "rb") as file:
                yield _binary_reader(file), os.fstat(file.fileno()).st_size
        else:
            yield _binary_reader(source), None


def _binary_reader(file: IO[bytes]) -> Callable[[int], bytes]:
    def read(size: int) -> bytes:
        chunk = file.read(size)
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError("open the document in binary mode ('rb')")
        return bytes(chunk)

    return read


def _media_type(document: DocumentInput, media_type: str | None) -> str:
    if media_type is not None:
        if not media_type.strip():
            raise ValueError("media_type must not be empty")
        return media_type
    name: object = None
    if isinstance(document, str | os.PathLike):
        name = os.fspath(document)
    elif not isinstance(document, bytes | bytearray | memoryview):
        name = getattr(document, "name", None)
    if isinstance(name, str):
        inferred = _SUFFIX_MEDIA_TYPES.get(Path(name).suffix.lower())
        if inferred is not None:
            return inferred
    raise ValueError(
        "cannot infer the media type: pass media_type= (one of "
        + ", ".join(sorted(set(_SUFFIX_MEDIA_TYPES.values())))
        + ") or a file named .pdf, .md, .markdown, .eml or .mbox"
    )


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP exchange: what to send, and how to turn the answer into `T` or an error."""

    method: Literal["GET", "POST"]
    path: str
    parse: Callable[[int, httpx.Headers, bytes], T]
    body: bytes | Upload | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def _coerce(model: type[R], request: R | Mapping[str, Any] | None, fields: Mapping[str, Any]) -> R:
    """A request model from a model, a mapping (snake_case or camelCase keys) or keywords."""
    if request is None:
        return model.model_validate(dict(fields))
    if fields:
        raise TypeError("pass either a request (model or mapping) or keyword fields, not both")
    if isinstance(request, model):
        return request
    if isinstance(request, Mapping):
        return model.model_validate(dict(request))
    raise TypeError(f"expected {model.__name__} or a mapping, got {type(request).__name__}")


def _json_body(request: BaseModel) -> bytes:
    # Only what the caller set: the host applies its own defaults, and a field the caller
    # never mentioned cannot trip an older host.
    return request.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")


def _json_headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "Accept": JSON_TYPES}


def raise_for_status(status: int, headers: httpx.Headers, body: bytes) -> None:
    """Raise the typed error of a non-2xx answer (a problem document or a bare status)."""
    if 200 <= status < 300:
        return
    raise error_for(status, headers, body)


def error_for(status: int, headers: httpx.Headers, body: bytes) -> APIStatusError:
    """The typed error of a non-2xx answer."""
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type in ("application/problem+json", "application/json"):
        try:
            problem = Problem.model_validate_json(body)
        except ValidationError:
            pass
        else:
            return error_from_problem(problem, status=status)
    return error_from_status(status, request_id=headers.get("x-request-id"))


def _parser(
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


def _check_same_source(
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


def _check_run_record(run_id: str) -> Callable[[RunRecord], RunRecord]:
    def check(record: RunRecord) -> RunRecord:
        if record.run_id != run_id:
            raise ProtocolError(f"asked for run {run_id!r}, got {record.run_id!r}")
        if record.result is not None:
            if record.result.run_id != run_id:
                raise ProtocolError("the recorded result belongs to another run")
            check_run_result(record.result)
        return record

    return check


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
    started); `run.completed` or `run.failed` ends it and nothing may follow. A completed
    result must be of the started run and pass `check_run_result`. Heartbeat comments and
    event types this client does not know are skipped.
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
            event = _run_event(sse)
            if event is None:
                continue
            self._accept(event)
            events.append(event)
        return events

    def _accept(self, event: RunEvent) -> None:
        if self.finished:
            raise ProtocolError(f"a {event.type} event after the run ended")
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
    sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    if isinstance(exc, httpx.TimeoutException):
        return RetrievalHostTimeoutError(
            f"timed out: {type(exc).__name__} ({exc})", request_sent=sent
        )
    return RetrievalHostConnectionError(
        f"connection failed: {type(exc).__name__} ({exc})", request_sent=sent
    )


# --- the shared base --------------------------------------------------------------------------


class BaseClient(Generic[H]):
    """Options and request building shared by `Client` and `AsyncClient` (no I/O here).

    `H` is the shell's httpx client, made once by the shell's `_open` from these options.
    """

    def __init__(
        self,
        base_url: str | httpx.URL,
        *,
        token: str | None = None,
        ca_bundle: str | os.PathLike[str] | ssl.SSLContext | None = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        trust_env: bool = True,
    ) -> None:
        self.base_url = check_base_url(base_url)
        token = resolve_token(token, os.environ)
        headers = {"User-Agent": USER_AGENT, "Accept": JSON_TYPES}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http_options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": headers,
            "verify": ssl_verify(ca_bundle),
            "timeout": _timeout(timeout),
            "trust_env": trust_env,
            # A redirect could carry the bearer token elsewhere; protocol v1 never redirects.
            "follow_redirects": False,
        }
        self.has_token = token is not None
        self._http: H = self._open(self._http_options)

    def _open(self, options: Mapping[str, Any]) -> H:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={str(self.base_url)!r})"

    # Each builder returns the Call of one method; the shells only execute it.

    def _discover(self) -> Call[ProtocolInfo]:
        return Call("GET", "/v1/protocol", _parser(ProtocolInfo))

    def _search(
        self, request: SearchRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[SearchResponse]:
        body = _coerce(SearchRequest, request, fields)
        return Call(
            "POST",
            "/v1/retrieval/search",
            _parser(SearchResponse, check_search_response(body)),
            _json_body(body),
            headers=_json_headers(),
        )

    def _index(
        self, request: IndexRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[IndexResponse]:
        body = _coerce(IndexRequest, request, fields)
        return Call(
            "POST",
            "/v1/retrieval/index",
            _parser(IndexResponse, _check_same_source(body.corpus, body.source.id)),
            _json_body(body),
            headers=_json_headers(),
        )

    def _ingest(
        self,
        document: DocumentInput,
        *,
        corpus: str,
        source_id: str,
        revision: str | None,
        title: str | None,
        media_type: str | None,
    ) -> Call[IndexResponse]:
        params = IngestParams(corpus=corpus, source_id=source_id, revision=revision, title=title)
        upload = Upload(document, _media_type(document, media_type))
        return Call(
            "POST",
            "/v1/retrieval/ingest",
            _parser(IndexResponse, _check_same_source(corpus, source_id)),
            upload,
            params=params.model_dump(by_alias=True, exclude_none=True),
            headers={"Content-Type": upload.media_type, "Accept": JSON_TYPES},
        )

    def _delete(
        self, request: DeleteRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[DeleteResponse]:
        body = _coerce(DeleteRequest, request, fields)
        return Call(
            "POST",
            "/v1/retrieval/delete",
            _parser(DeleteResponse, _check_same_source(body.corpus, body.source_id)),
            _json_body(body),
            headers=_json_headers(),
        )

    def _run(
        self, request: RunRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[RunResult]:
        body = _coerce(RunRequest, request, fields)
        return Call(
            "POST",
            "/v1/runs",
            _parser(RunResult, check_run_result),
            _json_body(body),
            headers=_json_headers(),
        )

    def _stream_run(
        self, request: RunRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[None]:
        body = _coerce(RunRequest, request, fields)

        def parse(status: int, headers: httpx.Headers, content: bytes) -> None:
            raise_for_status(status, headers, content)
            check_event_stream(headers)

        return Call(
            "POST",
            "/v1/runs",
            parse,
            _json_body(body),
            headers={"Content-Type": "application/json", "Accept": EVENT_STREAM},
        )

    def _get_run(self, run_id: str) -> Call[RunRecord]:
        if not run_id:
            raise ValueError("run_id must not be empty")
        return Call(
            "GET",
            "/v1/runs/" + quote(run_id, safe=""),
            _parser(RunRecord, _check_run_record(run_id)),
        )

    # --- inspection: what the token's subject may search -------------------------------------

    def _list_corpora(self) -> Call[CorporaResponse]:
        return Call("GET", "/v1/corpora", _parser(CorporaResponse))

    def _list_sources(
        self, corpus: str, *, limit: int | None, cursor: str | None
    ) -> Call[SourcesResponse]:
        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/sources",
            _parser(SourcesResponse, _check_page(cursor)),
            params=_page(limit, cursor),
        )

    def _get_source(
        self, corpus: str, source_id: str, *, limit: int | None, cursor: str | None
    ) -> Call[SourceResponse]:
        def check(response: SourceResponse) -> SourceResponse:
            if response.source.id != source_id:
                raise ProtocolError("the host answered for another source than asked")
            return _check_page(cursor)(response)

        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/sources/{_segment(source_id)}",
            _parser(SourceResponse, check),
            params=_page(limit, cursor),
        )

    def _get_passage(self, corpus: str, chunk_id: str) -> Call[PassageResponse]:
        def check(response: PassageResponse) -> PassageResponse:
            if response.chunk_id != chunk_id or response.scope.corpus != corpus:
                raise ProtocolError("the host answered for another passage than asked")
            return response

        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/passages/{_segment(chunk_id)}",
            _parser(PassageResponse, check),
        )


def _segment(value: str) -> str:
    """One path segment: every reserved character escaped (a source id may hold `/`)."""
    if not value:
        raise ValueError("corpus, source and chunk ids must not be empty")
    return quote(value, safe="")


def _page(limit: int | None, cursor: str | None) -> dict[str, str]:
    params = PageParams(limit=limit, cursor=cursor)
    return {k: str(v) for k, v in params.model_dump(by_alias=True, exclude_none=True).items()}


P = TypeVar("P", SourcesResponse, SourceResponse)


def _check_page(cursor: str | None) -> Callable[[P], P]:
    """A page must move on: a `nextCursor` equal to the one sent would page forever."""

    def check(response: P) -> P:
        if cursor is not None and response.next_cursor == cursor:
            raise ProtocolError("the host returned the same cursor again")
        return response

    return check


def corpora_of(response: CorporaResponse) -> list[CorpusInfo]:
    return list(response.corpora)

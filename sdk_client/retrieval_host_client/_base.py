"""Everything both clients share on the way out, without I/O: requests (the options a client
is made with are checked in `_options`).

`Client` and `AsyncClient` only send what a `Call` describes, read the response and hand the
bytes back to `Call.parse`; streamed runs feed their bytes to one `RunEventReader`. The way
back (which error a problem becomes, what a valid answer looks like) is in `_responses`. So the
rules exist once, and the two shells cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Generic, Literal, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from retrieval_host_client._errors import ClientClosedError
from retrieval_host_client._options import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_TIMEOUT,
    HEARTBEAT_MARGIN_S,
    TOKEN_ENV,
    TimeoutTypes,
    check_base_url,
    checked_timeout,
    resolve_token,
    ssl_verify,
    stream_timeout,
)
from retrieval_host_client._responses import (
    EVENT_STREAM,
    check_event_stream,
    check_page,
    check_passage,
    check_run_record,
    check_run_result,
    check_same_source,
    check_search_response,
    check_source,
    parser,
    raise_for_status,
)
from retrieval_host_client.models import (
    CorporaResponse,
    DeleteRequest,
    DeleteResponse,
    IndexRequest,
    IndexResponse,
    IngestParams,
    PageParams,
    PassageParams,
    PassageResponse,
    ProtocolInfo,
    SearchRequest,
    SearchResponse,
    SourceResponse,
    SourcesResponse,
)
from retrieval_host_client.run_models import RunRecord, RunRequest, RunResult

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_TIMEOUT",
    "HEARTBEAT_MARGIN_S",
    "TOKEN_ENV",
    "BaseClient",
    "Call",
    "DocumentInput",
    "TimeoutTypes",
    "Upload",
    "stream_timeout",
]

UPLOAD_CHUNK_BYTES: Final = 64 * 1024
CLIENT_VERSION: Final = "0.1.0"
USER_AGENT: Final = f"retrieval-host-client/{CLIENT_VERSION} httpx/{httpx.__version__}"

JSON_TYPES: Final = "application/json, application/problem+json"

# RFC 6750 b64token: what a bearer token may contain (the host issues `rh_` + base64url).

_SUFFIX_MEDIA_TYPES: Final[Mapping[str, str]] = {
    ".pdf": "application/pdf",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".eml": "message/rfc822",
    ".mbox": "application/mbox",
    ".txt": "text/plain",
    ".html": "text/html",
    ".htm": "text/html",
}

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
DocumentInput: TypeAlias = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


# --- streams ----------------------------------------------------------------------------------


DRAIN_BYTES: Final = 64 * 1024
"""At most what a shell reads of a stream after its terminal event, to reach the body's end:
httpx returns a connection to its pool only from a response read to the end, so a stream
closed right after `run.completed` would cost the next call a new TCP and TLS handshake.
Best effort: both shells give it `DRAIN_S`; the sync one reads only with a finite read
timeout, and a read under way when `DRAIN_S` passes ends with that read (a sync read cannot be
interrupted), so a host or proxy that keeps a finished stream open and silent holds a sync
call one read timeout at most. The bytes are not decoded: the terminal event was the answer."""

DRAIN_S: Final = 0.5
"""The longest a shell reads a stream after its terminal event (see `DRAIN_BYTES`)."""

STREAM_LEFT: Final = "this stream was closed when its block was left; read it inside the block"


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
        + ") or a file named .pdf, .md, .markdown, .txt, .html, .htm, .eml or .mbox"
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
    # An event stream: read with `stream_timeout`, not the client's timeout alone.
    streamed: bool = False


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
        # `identity`: the host never compresses, and a compressed answer is a body whose
        # size on the wire says nothing of its size decoded (probe C, session 40: a 4 MB
        # gzip answer became 3.85 GB; httpx asks for gzip and deflate by default).
        headers = {"User-Agent": USER_AGENT, "Accept": JSON_TYPES, "Accept-Encoding": "identity"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http_options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": headers,
            "verify": ssl_verify(ca_bundle),
            "timeout": checked_timeout(timeout),
            "trust_env": trust_env,
            # A redirect could carry the bearer token elsewhere; protocol v1 never redirects.
            "follow_redirects": False,
        }
        self.has_token = token is not None
        # The host's heartbeat interval, once `discover()` has read it (see `stream_timeout`).
        self._heartbeat_s: float | None = None
        self._http: H = self._open(self._http_options)

    def _open(self, options: Mapping[str, Any]) -> H:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={str(self.base_url)!r})"

    def _check_open(self) -> None:
        """`ClientClosedError` once the shell was closed (httpx's own is a bare RuntimeError)."""
        if self._http.is_closed:
            raise ClientClosedError(f"this {type(self).__name__} is closed; make a new one")

    def _raise_if_closed(self, error: RuntimeError) -> None:
        """After a send failed with `error`: `ClientClosedError` when the shell was closed
        meanwhile (by another thread or task, after `_check_open`), else nothing."""
        if self._http.is_closed:
            raise ClientClosedError(
                f"this {type(self).__name__} was closed during the call; make a new one"
            ) from error

    def _request(self, call: Call[Any], content: Any, length: int | None) -> httpx.Request:
        """The httpx request of `call`, its body `content` (bytes or a chunk iterator, from
        the shell's `_body`) of `length` bytes when known."""
        self._check_open()
        headers = dict(call.headers)
        if length is not None:
            headers["Content-Length"] = str(length)
        timeout = self._http.timeout
        if call.streamed:
            timeout = stream_timeout(timeout, self._heartbeat_s)
        return self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            headers=headers,
            content=content,
            timeout=timeout,
        )

    # Each builder returns the Call of one method; the shells only execute it.

    def _discover(self) -> Call[ProtocolInfo]:
        parse = parser(ProtocolInfo)

        def remember(status: int, headers: httpx.Headers, content: bytes) -> ProtocolInfo:
            # Asking costs a request, so only `discover()` does; streams made after it read
            # with this host's own interval, whatever it is.
            info = parse(status, headers, content)
            self._heartbeat_s = info.limits.heartbeat_s
            return info

        return Call("GET", "/v1/protocol", remember)

    def _search(
        self, request: SearchRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[SearchResponse]:
        body = _coerce(SearchRequest, request, fields)
        return Call(
            "POST",
            "/v1/retrieval/search",
            parser(SearchResponse, check_search_response(body)),
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
            parser(IndexResponse, check_same_source(body.corpus, body.source.id)),
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
        metadata: Mapping[str, str | int | float | bool | None] | None,
        media_type: str | None,
        stream: bool = False,
        idle_timeout_ms: int | None = None,
    ) -> Call[IndexResponse]:
        # Validated from a mapping: `metadata` is the JSON text of the object (a `Json` field,
        # whose constructor argument only pydantic's mypy plugin types as text), so that the
        # package type-checks without the plugin too (probe "sdk", session 43). NaN and
        # infinities pass `json.dumps` (as `NaN`), so that the model refuses them as
        # `pydantic.ValidationError` on `metadata`, as any other bad value.
        params = IngestParams.model_validate(
            {
                "corpus": corpus,
                "source_id": source_id,
                "revision": revision,
                "title": title,
                "metadata": None if metadata is None else json.dumps(dict(metadata)),
                "idle_timeout_ms": idle_timeout_ms,
            }
        )
        if not isinstance(document, str | os.PathLike | bytes | bytearray | memoryview) and not (
            callable(getattr(document, "read", None))
        ):
            raise TypeError(
                "document must be a path, bytes or a binary file object, not "
                f"{type(document).__name__}"
            )
        upload = Upload(document, _media_type(document, media_type))
        return Call(
            "POST",
            "/v1/retrieval/ingest",
            parser(IndexResponse, check_same_source(corpus, source_id)),
            upload,
            # round_trip: `metadata` goes as the JSON text the host parses.
            params=params.model_dump(by_alias=True, exclude_none=True, round_trip=True),
            # A stream of progress events when asked for; a host that answers JSON is read too.
            headers={
                "Content-Type": upload.media_type,
                "Accept": f"{EVENT_STREAM}, {JSON_TYPES}" if stream else JSON_TYPES,
            },
            streamed=stream,
        )

    def _delete(
        self, request: DeleteRequest | Mapping[str, Any] | None, fields: Mapping[str, Any]
    ) -> Call[DeleteResponse]:
        body = _coerce(DeleteRequest, request, fields)
        return Call(
            "POST",
            "/v1/retrieval/delete",
            parser(DeleteResponse, check_same_source(body.corpus, body.source_id)),
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
            parser(RunResult, check_run_result),
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
            streamed=True,
        )

    def _get_run(self, run_id: str) -> Call[RunRecord]:
        if not run_id:
            raise ValueError("run_id must not be empty")
        return Call(
            "GET",
            "/v1/runs/" + _segment(run_id),
            parser(RunRecord, check_run_record(run_id)),
        )

    # --- inspection: what the token's subject may search -------------------------------------

    def _list_corpora(self) -> Call[CorporaResponse]:
        return Call("GET", "/v1/corpora", parser(CorporaResponse))

    def _list_sources(
        self,
        corpus: str,
        *,
        limit: int | None,
        cursor: str | None,
        title: str | None = None,
        media_type: str | None = None,
    ) -> Call[SourcesResponse]:
        params = _page(limit, cursor)
        if title is not None:
            params["title"] = title
        if media_type is not None:
            params["mediaType"] = media_type
        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/sources",
            parser(SourcesResponse, check_page(cursor)),
            params=params,
        )

    def _get_source(
        self, corpus: str, source_id: str, *, limit: int | None, cursor: str | None
    ) -> Call[SourceResponse]:
        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/sources/{_segment(source_id)}",
            parser(SourceResponse, check_source(source_id, cursor)),
            params=_page(limit, cursor),
        )

    def _get_passage(
        self, corpus: str, chunk_id: str, revision: str | None
    ) -> Call[PassageResponse]:
        pinned = PassageParams(revision=revision).revision  # checked before anything is sent
        return Call(
            "GET",
            f"/v1/corpora/{_segment(corpus)}/passages/{_segment(chunk_id)}",
            parser(PassageResponse, check_passage(corpus, chunk_id, pinned)),
            params=None if pinned is None else {"revision": pinned},
        )


def _segment(value: str) -> str:
    """One path segment: every reserved character escaped (a source id may hold `/`), and the
    ids `.` and `..` as `%2E`: left as they are, URL resolution removes them as dot segments
    and the request reaches another route."""
    if not value:
        raise ValueError("corpus, source and chunk ids must not be empty")
    if value in (".", ".."):
        return "%2E" * len(value)
    return quote(value, safe="")


def _page(limit: int | None, cursor: str | None) -> dict[str, str]:
    params = PageParams(limit=limit, cursor=cursor)
    return {k: str(v) for k, v in params.model_dump(by_alias=True, exclude_none=True).items()}

"""`Client`: the synchronous shell. It sends what `_base` builds and hands back the bytes."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Generator, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from retrieval_host_client._base import (
    DRAIN_BYTES,
    DRAIN_S,
    STREAM_LEFT,
    UPLOAD_CHUNK_BYTES,
    BaseClient,
    Call,
    DocumentInput,
    Upload,
)
from retrieval_host_client._errors import ClientClosedError
from retrieval_host_client._fields import DeleteFields, IndexFields, RunFields, SearchFields
from retrieval_host_client._ingest_stream import IngestEventReader, ProgressCallback
from retrieval_host_client._responses import (
    BodyReader,
    RunEventReader,
    check_same_source,
    corpora_of,
    is_event_stream,
    next_cursor,
    transport_error,
)
from retrieval_host_client.models import (
    CorpusInfo,
    DeleteRequest,
    DeleteResponse,
    IndexRequest,
    IndexResponse,
    PassageResponse,
    ProtocolInfo,
    SearchRequest,
    SearchResponse,
    SourceListing,
    SourceResponse,
    WriteOnlyCorpus,
)
from retrieval_host_client.run_models import RunEvent, RunRecord, RunRequest, RunResult

__all__ = ["Client", "RunStream"]

T = TypeVar("T")


class RunStream:
    """The typed events of one streamed run; iterate it inside `Client.stream_run`.

    Iteration ends after `run.completed` or `run.failed` (a failed run is an event, not an
    exception; `until_done()` turns it into the typed error). Heartbeats are not events.
    Leaving a `for` loop early keeps the stream open: iterating again, or `until_done()`,
    goes on from the next event (leaving the `with` block closes it, and the host cancels the
    run; reading it after that raises `ClientClosedError`).
    """

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.iter_bytes()
        self._reader = RunEventReader()
        self._pending: list[RunEvent] = []
        self._ended = False
        self._closed = False

    @property
    def run_id(self) -> str | None:
        """The run's id, once `run.started` has been read."""
        return self._reader.run_id

    @property
    def result(self) -> RunResult | None:
        """The completed result, once `run.completed` has been read."""
        return self._reader.result

    def __iter__(self) -> RunStream:
        # The stream is its own iterator (not a generator per loop): a generator left by
        # `break` is closed when it is collected, and it would close the response with it.
        return self

    def __next__(self) -> RunEvent:
        while not self._pending:
            if self._ended or self._reader.finished:
                raise StopIteration
            if self._closed:
                raise ClientClosedError(STREAM_LEFT)
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._ended = True
                self._reader.end()
                raise
            except httpx.RequestError as exc:
                self._ended = True
                raise transport_error(exc) from exc
            self._pending.extend(self._reader.feed(chunk))
        return self._pending.pop(0)

    def until_done(self) -> RunResult:
        """Read the remaining events; return the result or raise the failed run's error."""
        for _ in self:
            pass
        return self._reader.outcome()

    def _close(self) -> None:
        """Close the response; after the terminal event, read to its end first, so the
        connection goes back to the pool."""
        self._closed = True
        try:
            if self._reader.finished and not self._ended:
                self._ended = True
                _drain(self._response, self._chunks)
        finally:
            self._response.close()


def _drain(response: httpx.Response, chunks: Iterator[bytes]) -> None:
    """Read what is left of a response whose terminal event has been read, up to
    `DRAIN_BYTES` and for at most `DRAIN_S` seconds, and only under a finite read timeout
    (the read under way when `DRAIN_S` passes is not interrupted: a sync read cannot be);
    a transport error here only means the connection is not kept. What is read is not
    decoded: the terminal event was the answer."""
    timeout = response.request.extensions.get("timeout", {})
    if timeout.get("read") is None:
        return
    # A deadline as the async shell's, on the monotonic clock (probe C, session 40: a host
    # trickling 3 bytes every 0.5 s after `run.completed` held the call for hours).
    deadline = time.monotonic() + DRAIN_S
    read = 0
    with contextlib.suppress(httpx.RequestError):
        for chunk in chunks:
            read += len(chunk)
            if read > DRAIN_BYTES or time.monotonic() >= deadline:
                return


def _read(response: httpx.Response) -> bytes:
    """The body of an answer that is not a stream, read under `BodyReader`'s bounds (the
    caller closes the response; one not read to its end is not pooled)."""
    body = BodyReader(response.status_code, response.headers)
    try:
        for chunk in response.iter_bytes():
            if body.feed(chunk):
                break
    except httpx.RequestError as exc:
        raise transport_error(exc) from exc
    return body.body()


class Client(BaseClient[httpx.Client]):
    """Synchronous client of a retrieval host (protocol v1).

    `Client(base_url, *, token=None, ca_bundle=None, timeout=30.0, trust_env=True)`:

    - `token`: the bearer token; when omitted, `RETRIEVAL_HOST_TOKEN` is read once, here.
    - `ca_bundle`: a PEM file (or an `ssl.SSLContext`) to trust instead of the default CAs.
    - `timeout`: seconds (or an `httpx.Timeout`) for connecting, each read and each write;
      `None` waits forever. A stream's reads (`stream_run`, a streamed ingest) wait at least
      the host's heartbeat interval plus 5 s (20 s, or what `discover()` read), so its
      heartbeats keep them alive whatever `timeout` is.
    - `trust_env`: honour `HTTPS_PROXY`/`NO_PROXY` (and `SSL_CERT_FILE` when no `ca_bundle`).

    Nothing is retried automatically, reads included: a mutation whose answer was lost raises
    `RetrievalHostConnectionError` and may or may not have been applied. Redirects are not
    followed. Use it as a context manager, or call `close()`.
    """

    def _open(self, options: Mapping[str, Any]) -> httpx.Client:
        return httpx.Client(**options)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, call: Call[T]) -> T:
        with self._body(call.body) as (content, length):
            request = self._request(call, content, length)
            try:
                # Streamed, so the body is read under a bound (probe C, session 40: read
                # whole, an endless answer grew the client to gigabytes).
                response = self._http.send(request, stream=True)
            except httpx.RequestError as exc:
                raise transport_error(exc) from exc
            except RuntimeError as exc:  # httpx's, when closed meanwhile
                self._raise_if_closed(exc)
                raise
        try:
            body = _read(response)
        finally:
            response.close()
        return call.parse(response.status_code, response.headers, body)

    @staticmethod
    @contextlib.contextmanager
    def _body(
        body: bytes | Upload | None,
    ) -> Iterator[tuple[bytes | Iterator[bytes] | None, int | None]]:
        if not isinstance(body, Upload):
            yield body, None
            return
        with body.opened() as (source, length):
            if isinstance(source, bytes):
                yield source, length
            else:
                yield iter(functools.partial(source, UPLOAD_CHUNK_BYTES), b""), length

    def discover(self) -> ProtocolInfo:
        """`GET /v1/protocol`: name, version, capabilities, limits and auth scheme (no token).

        The client keeps the host's heartbeat interval (`limits.heartbeat_s`): later streams'
        reads wait at least that plus 5 s, instead of the 20 s assumed of a host not asked."""
        return self._send(self._discover())

    def search_context(
        self,
        request: SearchRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[SearchFields],
    ) -> SearchResponse:
        """Search what the token's subject may read: a `SearchRequest`, a mapping or keywords
        (`corpus=`, `query=`, `source_ids=`, `limit=`, `max_context_bytes=`, `filters=`,
        `mode=` hybrid, dense or lexical, `min_score=`, `rerank=`, `max_age_s=`)."""
        return self._send(self._search(request, fields))

    def index_context(
        self,
        request: IndexRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[IndexFields],
    ) -> IndexResponse:
        """Replace one source revision with prepared passages (`unchanged` when identical)."""
        return self._send(self._index(request, fields))

    def ingest_context(
        self,
        document: DocumentInput,
        *,
        corpus: str,
        source_id: str,
        revision: str | None = None,
        title: str | None = None,
        metadata: Mapping[str, str | int | float | bool | None] | None = None,
        media_type: str | None = None,
        on_progress: ProgressCallback | None = None,
        stream: bool = True,
        idle_timeout_ms: int | None = None,
    ) -> IndexResponse:
        """Upload a raw PDF, Markdown, text, HTML or e-mail document; the host parses and
        indexes it.

        `document` is a path (streamed from disk in chunks), bytes, or a binary file object
        (read in chunks from its position, not closed). `media_type` defaults to the one of
        the file name's suffix (.pdf, .md/.markdown, .txt, .html/.htm, .eml, .mbox).
        `metadata` (at most 16 scalar values) is laid over what the document yields, key by
        key: searches filter on it and hits show it.

        The host streams the ingest's progress (`stream=False` asks for one JSON answer):
        `on_progress` gets each `IngestProgressEvent` (`phase` parse, embed or commit, with
        passages done and total). The host sends a heartbeat every `runs.heartbeatS`
        (15 s by default), and the stream's reads wait that long plus 5 s even when `timeout`
        is shorter (20 s unless `discover()` told another interval), so the heartbeats keep
        the reads alive however long the document takes. Leaving early (an exception
        in `on_progress`, a cancelled task) closes the connection: the host cancels the
        ingest and keeps the previous revision. `idle_timeout_ms` asks the host to end the
        ingest (`HostTimeoutError`, reason `idle-timeout`) after that long without progress.
        """
        call = self._ingest(
            document,
            corpus=corpus,
            source_id=source_id,
            revision=revision,
            title=title,
            metadata=metadata,
            media_type=media_type,
            stream=stream,
            idle_timeout_ms=idle_timeout_ms,
        )
        if not stream:
            return self._send(call)
        return self._streamed_ingest(
            call, IngestEventReader(check_same_source(corpus, source_id), on_progress)
        )

    def _streamed_ingest(
        self, call: Call[IndexResponse], reader: IngestEventReader
    ) -> IndexResponse:
        with self._body(call.body) as (content, length):
            request = self._request(call, content, length)
            try:
                response = self._http.send(request, stream=True)
            except httpx.RequestError as exc:
                raise transport_error(exc) from exc
            except RuntimeError as exc:  # httpx's, when closed meanwhile
                self._raise_if_closed(exc)
                raise
        try:
            if not is_event_stream(response):  # a refusal, or a host that answers JSON
                return call.parse(response.status_code, response.headers, _read(response))
            chunks = response.iter_bytes()
            for chunk in chunks:
                reader.feed(chunk)
                if reader.finished:
                    _drain(response, chunks)
                    break
            else:
                reader.end()
            return reader.outcome()
        except httpx.RequestError as exc:
            raise transport_error(exc) from exc
        finally:
            response.close()

    def delete_context(
        self,
        request: DeleteRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[DeleteFields],
    ) -> DeleteResponse:
        """Delete exactly one revision of a source (`corpus=`, `source_id=`, `revision=`)."""
        return self._send(self._delete(request, fields))

    def run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> RunResult:
        """Run grounded generation and wait for the result (a failed run raises its error)."""
        return self._send(self._run(request, fields))

    @contextlib.contextmanager
    def stream_run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> Iterator[RunStream]:
        """Run grounded generation as a stream of typed events.

        `with client.stream_run(...) as stream: for event in stream: ...` — a refusal before
        the run starts raises its typed error here; leaving the block closes the response
        (the host then cancels a run that has not ended).
        """
        call = self._stream_run(request, fields)
        assert isinstance(call.body, bytes)
        http_request = self._request(call, call.body, None)
        try:
            response = self._http.send(http_request, stream=True)
        except httpx.RequestError as exc:
            raise transport_error(exc) from exc
        except RuntimeError as exc:  # httpx's, when closed meanwhile
            self._raise_if_closed(exc)
            raise
        stream = RunStream(response)
        try:
            refused = not 200 <= response.status_code < 300
            call.parse(response.status_code, response.headers, _read(response) if refused else b"")
            yield stream
        finally:
            stream._close()

    def get_run(self, run_id: str) -> RunRecord:
        """`GET /v1/runs/{id}`: the recorded run of the token's subject."""
        return self._send(self._get_run(run_id))

    # --- inspection: what the token's subject may search ---------------------------------------

    def list_corpora(self) -> list[CorpusInfo]:
        """`GET /v1/corpora`: the corpora the token may search, each with its embedding labels,
        the token's operations on it and counts over the sources its subject may search."""
        return corpora_of(self._send(self._list_corpora()))

    def list_write_only_corpora(self) -> list[WriteOnlyCorpus]:
        """`GET /v1/corpora`'s `writeOnly`: the host's corpora the token may index into or
        delete from but not search (ids and operations; empty from a host before this)."""
        return list((self._send(self._list_corpora())).write_only)

    def list_sources(
        self,
        corpus: str,
        *,
        page_size: int | None = None,
        cursor: str | None = None,
        title: str | None = None,
        media_type: str | None = None,
    ) -> Generator[SourceListing, None, None]:
        """Every source of `corpus` the subject may search, at its authorized revision (the
        one a delete names), by id: a generator that fetches pages of `page_size`
        (1-1000; the host's default 100) lazily, following `nextCursor`. `cursor` resumes a
        listing from a page's `nextCursor`. `title` keeps sources whose title holds it (case
        ignored), `media_type` those of that media type. To stop early, `close()` it, or
        iterate it in `with contextlib.closing(client.list_sources(...)) as sources:`. A host
        that returns a cursor of an earlier page again raises `ProtocolError`."""
        followed: set[str] = set() if cursor is None else {cursor}
        while True:
            call = self._list_sources(
                corpus, limit=page_size, cursor=cursor, title=title, media_type=media_type
            )
            page = self._send(call)
            yield from page.sources
            cursor = next_cursor(page, followed)
            if cursor is None:
                return

    def get_source(
        self, corpus: str, source_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> SourceResponse:
        """One source at its authorized revision with a page of its passages (chunk id,
        location, bytes); pass the answer's `next_cursor` as `cursor` for the next page.
        A missing and an unauthorized source both raise `SourceUnavailableError`."""
        return self._send(self._get_source(corpus, source_id, limit=limit, cursor=cursor))

    def get_passage(
        self, corpus: str, chunk_id: str, *, revision: str | None = None
    ) -> PassageResponse:
        """One passage as a search hit shows it, authorized now: open a saved citation.
        `revision` is the citation's (its manifest entry's or hit's): a new revision of the
        source that reuses the chunk id is then refused too. A changed revision (of a chunk id
        the host issued, or pinned by `revision`), a revoked grant and a missing passage raise
        `SourceUnavailableError`."""
        return self._send(self._get_passage(corpus, chunk_id, revision))

"""One synchronous face over both clients, so each client test runs in both modes.

`PortalClient` drives an `AsyncClient` on a real asyncio event loop in a portal thread
(`anyio.from_thread`): every coroutine of the async shell really runs on a loop, and the test
body stays the same for both modes (openai-python parametrises one fixture the same way).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, Unpack

from anyio.from_thread import BlockingPortal

from retrieval_host_client import (
    AsyncClient,
    AsyncRunStream,
    CorpusInfo,
    DeleteFields,
    DeleteRequest,
    DeleteResponse,
    DocumentInput,
    IndexFields,
    IndexRequest,
    IndexResponse,
    IngestProgressEvent,
    PassageResponse,
    ProtocolInfo,
    RunEvent,
    RunFields,
    RunRecord,
    RunRequest,
    RunResult,
    SearchFields,
    SearchRequest,
    SearchResponse,
    SourceListing,
    SourceResponse,
    WriteOnlyCorpus,
)


class StreamApi(Protocol):
    @property
    def run_id(self) -> str | None: ...

    @property
    def result(self) -> RunResult | None: ...

    def __iter__(self) -> Iterator[RunEvent]: ...

    def until_done(self) -> RunResult: ...


class ClientApi(Protocol):
    """The synchronous `Client` surface; `Client` itself satisfies it."""

    def discover(self) -> ProtocolInfo: ...

    def search_context(
        self,
        request: SearchRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[SearchFields],
    ) -> SearchResponse: ...

    def index_context(
        self,
        request: IndexRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[IndexFields],
    ) -> IndexResponse: ...

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
        on_progress: Callable[[IngestProgressEvent], None] | None = None,
        stream: bool = True,
    ) -> IndexResponse: ...

    def delete_context(
        self,
        request: DeleteRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[DeleteFields],
    ) -> DeleteResponse: ...

    def run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> RunResult: ...

    def stream_run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> contextlib.AbstractContextManager[StreamApi]: ...

    def get_run(self, run_id: str) -> RunRecord: ...

    def list_corpora(self) -> list[CorpusInfo]: ...

    def list_write_only_corpora(self) -> list[WriteOnlyCorpus]: ...

    def list_sources(
        self,
        corpus: str,
        *,
        page_size: int | None = None,
        cursor: str | None = None,
        title: str | None = None,
        media_type: str | None = None,
    ) -> Iterator[SourceListing]: ...

    def get_source(
        self, corpus: str, source_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> SourceResponse: ...

    def get_passage(
        self, corpus: str, chunk_id: str, *, revision: str | None = None
    ) -> PassageResponse: ...

    def close(self) -> None: ...


class PortalStream:
    """An `AsyncRunStream` iterated from the test thread, one `__anext__` per portal call."""

    def __init__(self, portal: BlockingPortal, stream: AsyncRunStream) -> None:
        self._portal = portal
        self._stream = stream

    @property
    def run_id(self) -> str | None:
        return self._stream.run_id

    @property
    def result(self) -> RunResult | None:
        return self._stream.result

    def __iter__(self) -> Iterator[RunEvent]:
        while True:
            try:
                yield self._portal.call(self._stream.__anext__)
            except StopAsyncIteration:
                return

    def until_done(self) -> RunResult:
        return self._portal.call(self._stream.until_done)


class PortalClient:
    """`ClientApi` over an `AsyncClient` whose coroutines run on the portal's event loop."""

    def __init__(self, portal: BlockingPortal, client: AsyncClient) -> None:
        self._portal = portal
        self.client = client

    def discover(self) -> ProtocolInfo:
        return self._portal.call(self.client.discover)

    def search_context(
        self,
        request: SearchRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[SearchFields],
    ) -> SearchResponse:
        return self._portal.call(functools.partial(self.client.search_context, request, **fields))

    def index_context(
        self,
        request: IndexRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[IndexFields],
    ) -> IndexResponse:
        return self._portal.call(functools.partial(self.client.index_context, request, **fields))

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
        on_progress: Callable[[IngestProgressEvent], None] | None = None,
        stream: bool = True,
    ) -> IndexResponse:
        call = functools.partial(
            self.client.ingest_context,
            document,
            corpus=corpus,
            source_id=source_id,
            revision=revision,
            title=title,
            metadata=metadata,
            media_type=media_type,
            on_progress=on_progress,
            stream=stream,
        )
        return self._portal.call(call)

    def delete_context(
        self,
        request: DeleteRequest | Mapping[str, Any] | None = None,
        /,
        **fields: Unpack[DeleteFields],
    ) -> DeleteResponse:
        return self._portal.call(functools.partial(self.client.delete_context, request, **fields))

    def run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> RunResult:
        return self._portal.call(functools.partial(self.client.run, request, **fields))

    @contextlib.contextmanager
    def stream_run(
        self, request: RunRequest | Mapping[str, Any] | None = None, /, **fields: Unpack[RunFields]
    ) -> Iterator[StreamApi]:
        manager = self._portal.wrap_async_context_manager(self.client.stream_run(request, **fields))
        with manager as stream:
            yield PortalStream(self._portal, stream)

    def get_run(self, run_id: str) -> RunRecord:
        return self._portal.call(self.client.get_run, run_id)

    def list_corpora(self) -> list[CorpusInfo]:
        return self._portal.call(self.client.list_corpora)

    def list_write_only_corpora(self) -> list[WriteOnlyCorpus]:
        return self._portal.call(self.client.list_write_only_corpora)

    def list_sources(
        self,
        corpus: str,
        *,
        page_size: int | None = None,
        cursor: str | None = None,
        title: str | None = None,
        media_type: str | None = None,
    ) -> Iterator[SourceListing]:
        sources = self.client.list_sources(
            corpus, page_size=page_size, cursor=cursor, title=title, media_type=media_type
        )
        while True:
            try:
                yield self._portal.call(sources.__anext__)
            except StopAsyncIteration:
                return

    def get_source(
        self, corpus: str, source_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> SourceResponse:
        call = functools.partial(
            self.client.get_source, corpus, source_id, limit=limit, cursor=cursor
        )
        return self._portal.call(call)

    def get_passage(
        self, corpus: str, chunk_id: str, *, revision: str | None = None
    ) -> PassageResponse:
        return self._portal.call(
            functools.partial(self.client.get_passage, revision=revision), corpus, chunk_id
        )

    def close(self) -> None:
        self._portal.call(self.client.aclose)

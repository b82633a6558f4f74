"""The driver: the in-process API that the HTTP layer and embedding applications call."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, cast, runtime_checkable

from retrieval_host.core.cancel import CancelToken, LinkedCancel
from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import utc_now
from retrieval_host.core.errors import ErrorCode, RetrievalError, permission_denied
from retrieval_host.core.inspection import (
    DEFAULT_PAGE_LIMIT,
    CorpusSummary,
    Passage,
    SourceDetail,
    SourceFilter,
    SourcePage,
)
from retrieval_host.core.lifecycle import (
    Effect,
    FoundT,
    GrantT,
    PreparedT,
    RequestT_contra,
    ResultT,
    Retrieval,
    Retrieved,
    run_retrieval,
)
from retrieval_host.core.models import (
    DeleteRequest,
    DeleteResult,
    EmbeddingUsage,
    IndexRequest,
    IndexResult,
    JSONScalar,
    RerankUsage,
    SearchRequest,
    SearchResult,
)
from retrieval_host.core.ports import VectorStore
from retrieval_host.core.run_ports import RunRecord
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs_model import RunEvent, RunRequest, RunResult
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.core.usage import UsageOperation, UsageSink, embedding_record, rerank_record
from retrieval_host.core.validation import check_id, check_user_metadata
from retrieval_host.ingest import ChunkingSettings, IngestLimits, PreparedDocument
from retrieval_host.ingest.chunking import Extracted
from retrieval_host.ingest.document import extract_document, finish_document
from retrieval_host.ingest.isolation import ParsePool, ParseTask, counter_recipe
from retrieval_host.ingest.settings import normalize_media_type, too_complex

_DEFAULT_LIMITS = IngestLimits()
_DONE = object()
# The ingest deadline when the caller names none (`limits.ingestDeadlineS` of the host): parse
# and embedding of one document. The local model embeds 5-20 passages a second on two busy
# cores, so this admits documents of ~600-2,400 passages; raise it for larger ones.
DEFAULT_INGEST_DEADLINE_S = 120.0
# One pool per process, shared by every driver in it (processes start on first use).
_SHARED_POOL = ParsePool()


def shared_parse_pool() -> ParsePool:
    """The process-wide pool of parse workers that drivers use by default."""
    return _SHARED_POOL


class _Deadline:
    """Cancels the document's token when the ingest deadline passes; remembers that it did, so
    the resulting `CANCELLED` can be told apart from a disconnect and answered as
    `DOCUMENT_TOO_COMPLEX` / `deadline`."""

    def __init__(self, cancel: CancelToken, seconds: float) -> None:
        self.seconds = seconds
        self.expired = threading.Event()
        self._cancel = cancel
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._started = time.monotonic()

    def _fire(self) -> None:
        self.expired.set()
        self._cancel.cancel()

    def remaining(self) -> float:
        return max(0.0, self.seconds - (time.monotonic() - self._started))

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _run_context(request: RunRequest, context: RequestContext) -> RequestContext:
    """The run's own token: the request's `idle_timeout_ms` on top of the caller's token, and
    ending the run (leaving a stream early) cancels the run, not the caller's other work."""
    idle = None if request.idle_timeout_ms is None else request.idle_timeout_ms / 1000
    return replace(context, cancel=LinkedCancel(context.cancel, idle))


def _stream(
    engine: RunEngine, request: RunRequest, context: RequestContext
) -> Generator[RunEvent, None, None]:
    # The run executes in its own thread so events reach the caller as they happen; leaving
    # the iterator early cancels the run.
    context = _run_context(request, context)
    events: queue.SimpleQueue[RunEvent | BaseException | object] = queue.SimpleQueue()

    def work() -> None:
        try:
            engine.execute(request, context, events.put)
        except BaseException as exc:  # delivered to the consumer
            events.put(exc)
        finally:
            events.put(_DONE)

    thread = threading.Thread(target=work, name="run", daemon=True)
    thread.start()
    try:
        while (item := events.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield cast(RunEvent, item)
    finally:
        context.cancel.cancel()
        thread.join()


@dataclass(frozen=True)
class IngestRequest:
    """A raw document to turn into passages and index as one source revision.

    `revision` defaults to a digest of the content (see `retrieval_host.ingest.document`);
    `title` defaults to the document's own title; `metadata`, the caller's own, is laid over
    the document's key by key (and so is in the default revision).
    """

    corpus: str
    source_id: str
    media_type: str
    data: bytes
    revision: str | None = None
    title: str | None = None
    # The caller's metadata (`check_user_metadata`), laid over what the document yields.
    metadata: Mapping[str, JSONScalar] | None = None


@runtime_checkable
class _Readable(Protocol):
    """A record store that can say whether it still answers (`SqliteRunStore`)."""

    def check_readable(self) -> None: ...


class Driver:
    """The in-process API: retrieval operations, ingestion and grounded runs.

    Synchronous, like the service: callers on an event loop run it in a worker thread.
    `runs` is None when no generation provider is configured.
    """

    def __init__(
        self,
        retrieval: RetrievalService,
        *,
        ingest_limits: IngestLimits = _DEFAULT_LIMITS,
        runs: RunEngine | None = None,
        parse_pool: ParsePool | None = _SHARED_POOL,
        ingest_deadline_s: float = DEFAULT_INGEST_DEADLINE_S,
        usage: UsageSink | None = None,
    ) -> None:
        self.retrieval = retrieval
        # Usage records of searches and ingests (`core.usage`); runs record their own. Default:
        # the run engine's sink (the run store's table), None without runs.
        self.usage = usage if usage is not None else (runs.usage if runs is not None else None)
        self.ingest_limits = ingest_limits
        self.runs = runs
        # None parses in the calling thread: only for trusted input (tests of pure parsing).
        self.parse_pool = parse_pool
        self.ingest_deadline_s = ingest_deadline_s

    def run(self, request: RunRequest, context: RequestContext) -> RunResult:
        """A grounded run to its end; raises the run's typed error if it fails."""
        return self._runs().run(request, _run_context(request, context))

    def stream_run(
        self, request: RunRequest, context: RequestContext
    ) -> Generator[RunEvent, None, None]:
        """The same run as typed events: run.started, run.progress, run.delta, then
        run.completed or run.failed. Events are produced as the run advances."""
        return _stream(self._runs(), request, context)

    def execute_run(
        self, request: RunRequest, context: RequestContext, emit: Callable[[RunEvent], None]
    ) -> None:
        """The same run with every event sent to `emit` from the calling thread (the HTTP
        layer's worker): ends with run.completed or run.failed. Errors before a run exists
        (unknown provider, bad input, a reused key) raise instead."""
        self._runs().execute(request, _run_context(request, context), emit)

    def get_run(
        self,
        run_id: str,
        context: RequestContext,
        *,
        permits: Callable[[RunRecord], bool] | None = None,
    ) -> RunRecord:
        """The recorded run of this subject, its evidence re-authorized; `permits` may refuse
        a record (the answer is then the one for a run that does not exist)."""
        return self._runs().get_run(run_id, context, permits=permits)

    @property
    def runs_enabled(self) -> bool:
        """Whether grounded runs are available (a generation provider is configured)."""
        return self.runs is not None

    @property
    def indexing_enabled(self) -> bool:
        """Whether any corpus takes writes (discovery's `retrieval-indexing`): not when every
        store is read-only."""
        return any(not c.store.read_only for c in self.retrieval.corpora.values())

    @property
    def stores(self) -> list[VectorStore]:
        """Every store of the configured corpora, once each (for metrics and readiness)."""
        return list({id(c.store): c.store for c in self.retrieval.corpora.values()}.values())

    def stores_answer(self) -> bool:
        """Whether every corpus's store still answers a read (the readiness check), through
        the connections searches read with too (`indexed_at`: SQLite's per-thread readers;
        a damaged database file failed every search while the main connection still read),
        and so do the run records. The factory opened the stores and loaded the models
        before the host started."""
        try:
            for corpus in self.retrieval.corpora.values():
                corpus.store.get_source(corpus.id, "readyz", "readyz")
                corpus.store.indexed_at(corpus.id, "readyz", ("readyz",))
            for records in self._record_stores():
                records.check_readable()
        except Exception:
            return False
        return True

    def _record_stores(self) -> list[_Readable]:
        """The run records' store, reached as the usage sink it also is (`wiring` and the
        example application pass one object as both): with its `runs.db` removed, /readyz
        said ready while every run and usage record went into the lost file (a black-box
        test). A store without the check (PostgreSQL's fails each query on its own) is not
        asked."""
        found: dict[int, _Readable] = {}
        for sink in (self.usage, self.runs.usage if self.runs is not None else None):
            if isinstance(sink, _Readable):
                found[id(sink)] = sink
        return list(found.values())

    def close(self) -> None:
        """Close every store once, the run records and the providers. Call after the host
        and its work have stopped."""
        for store in self.stores:
            store.close()
        if self.runs is not None:
            self.runs.close()

    def _runs(self) -> RunEngine:
        if self.runs is None:
            raise permission_denied()
        return self.runs

    def retrieve(
        self,
        retrieval: Retrieval[RequestT_contra, PreparedT, GrantT, FoundT, ResultT],
        request: RequestT_contra,
        context: RequestContext,
        *,
        effects: Sequence[Effect[ResultT]] = (),
    ) -> Retrieved[ResultT]:
        """An application's own retrieval, run on the lifecycle's one path (prepare, assert
        input, authorize, execute, assert result, then `effects` in order), the path the
        built-in search takes too (`core.lifecycle`; `examples/custom_retrieval.py`)."""
        return run_retrieval(retrieval, request, context, effects)

    def search_calls_no_model(self, request: SearchRequest, subject: str) -> bool:
        """Whether that search would call no model right now (see `RetrievalService`)."""
        return self.retrieval.search_calls_no_model(request, subject)

    def search_context(self, request: SearchRequest, context: RequestContext) -> SearchResult:
        """Authorized similarity search."""
        result = self.retrieval.search_context(request, context)
        self._meter("search", request.corpus, context, result.usage, result.rerank_usage)
        return result

    def index_context(self, request: IndexRequest, context: RequestContext) -> IndexResult:
        """Atomically replace one source revision with prepared passages."""
        result = self.retrieval.index_context(request, context)
        self._meter("index", request.corpus, context, result.usage)
        return result

    def _meter(
        self,
        operation: UsageOperation,
        corpus_id: str,
        context: RequestContext,
        embedding: EmbeddingUsage,
        rerank: RerankUsage | None = None,
    ) -> None:
        """Usage records of one successful operation, to the sink (`core.usage`)."""
        if self.usage is None:
            return
        corpus = self.retrieval.corpus(corpus_id)
        at = utc_now()
        subject = context.subject
        records = embedding_record(
            at, subject, operation, corpus.id, corpus.embedding.descriptor, embedding
        )
        if rerank is not None and corpus.reranker is not None:
            descriptor = corpus.reranker.descriptor
            records += rerank_record(at, subject, operation, corpus.id, descriptor, rerank)
        if records:
            self.usage.record_usage(records)

    def delete_context(self, request: DeleteRequest, context: RequestContext) -> DeleteResult:
        """Delete exactly the authorized revision of a source."""
        return self.retrieval.delete_context(request, context)

    def writable_corpus_ids(self) -> frozenset[str]:
        """The ids of the corpora this driver serves whose store takes writes (not a
        read-only snapshot or replica); no counts, no authorization."""
        return frozenset(c.id for c in self.retrieval.corpora.values() if not c.store.read_only)

    def list_corpora(
        self, context: RequestContext, corpus_ids: Collection[str] | None = None
    ) -> list[CorpusSummary]:
        """The corpora the subject may search (of `corpus_ids`, when given), with counts over
        the sources visible to it; a denied corpus is left out like a missing one."""
        return self.retrieval.list_corpora(context, corpus_ids)

    def list_sources(
        self,
        corpus: str,
        context: RequestContext,
        *,
        limit: int = DEFAULT_PAGE_LIMIT,
        cursor: str | None = None,
        where: SourceFilter | None = None,
    ) -> SourcePage:
        """One page of the sources the subject may search, at their authorized revision, that
        `where` keeps (title substring, media type)."""
        return self.retrieval.list_sources(corpus, context, limit=limit, cursor=cursor, where=where)

    def get_source(
        self,
        corpus: str,
        source_id: str,
        context: RequestContext,
        *,
        limit: int = DEFAULT_PAGE_LIMIT,
        cursor: str | None = None,
    ) -> SourceDetail:
        """One visible source with a page of its passages (`SOURCE_UNAVAILABLE` otherwise)."""
        return self.retrieval.get_source(corpus, source_id, context, limit=limit, cursor=cursor)

    def get_passage(
        self,
        corpus: str,
        chunk_id: str,
        context: RequestContext,
        *,
        revision: str | None = None,
    ) -> Passage:
        """The passage behind a citation, authorized at read, at the citation's `revision`
        when given (`SOURCE_UNAVAILABLE` otherwise)."""
        return self.retrieval.get_passage(corpus, chunk_id, context, revision=revision)

    def ingest_context(
        self,
        request: IngestRequest,
        context: RequestContext,
        *,
        deadline_s: float | None = None,
    ) -> IndexResult:
        """Parse a raw document into passages and index them.

        The corpus's own chunking identity decides the passage size (an empty one means the
        defaults), measured with the corpus's embedding tokenizer. Before any parsing the
        caller must hold an `index` grant for the source (for the given revision, or `*`): a
        subject without one cannot make the host parse a file. Parsing runs in a parse worker
        process (`ingest.isolation`; in the calling thread when `parse_pool` is None), killed
        as soon as `context.cancel` is cancelled. The index is then written through
        `index_context`, so authorization is asked again and the revision appears atomically,
        or, when identical, is reported `unchanged` without embedding.

        `deadline_s` (default `ingest_deadline_s`) bounds parsing and embedding together: when
        it passes, the work is cancelled and the answer is `DOCUMENT_TOO_COMPLEX` / `deadline`.
        A failure, a cancel or the deadline at any point leaves the previous revision in place.
        """
        if deadline_s is not None and (
            isinstance(deadline_s, bool) or not math.isfinite(deadline_s) or deadline_s <= 0
        ):
            # It answered DOCUMENT_TOO_COMPLEX, "took longer than -1 s" (a black-box test).
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST, "deadline_s must be a positive number of seconds."
            )
        if not isinstance(request.data, bytes | bytearray):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST, "an ingest request's data must be the file's bytes."
            )
        media_type = normalize_media_type(request.media_type)
        corpus = self.retrieval.corpus(request.corpus)
        check_id("source id", request.source_id)
        if request.revision is not None:
            check_id("revision", request.revision)
        if request.metadata is not None:
            check_user_metadata(request.metadata)
        self.retrieval.preauthorize_index(corpus.id, request.source_id, request.revision, context)
        settings = ChunkingSettings.from_identity(corpus.chunking)
        if settings.max_tokens > corpus.embedding.max_input_tokens:
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"the corpus chunks to {settings.max_tokens} tokens but its embedding model "
                f"reads {corpus.embedding.max_input_tokens}; passages would be cut.",
                reason="chunking-exceeds-model",
            )
        context.cancel.check()
        # The first progress report: every check that needs no parsing has passed.
        context.report("ingest.parse", corpus=corpus.id, done=0, total=None)
        seconds = self.ingest_deadline_s if deadline_s is None else deadline_s
        # The document's own token: the deadline must not cancel the caller's (a batch ingest
        # shares one context across files, and one slow file would stop the rest).
        context = replace(context, cancel=LinkedCancel(context.cancel))
        with _Deadline(context.cancel, seconds) as deadline:
            try:
                prepared = self._prepare(request, media_type, corpus, settings, context, deadline)
                context.cancel.check()
                count = len(prepared.chunks)
                context.report("ingest.parse", corpus=corpus.id, done=count, total=count)
                indexed = replace(prepared.index_request(corpus.id), media_type=media_type)
                result = self.retrieval.index_context(indexed, context)
                self._meter("ingest", corpus.id, context, result.usage)
                return result
            except RetrievalError as exc:
                if exc.code is ErrorCode.CANCELLED and deadline.expired.is_set():
                    raise too_complex(
                        "deadline",
                        f"parsing and embedding the document took longer than {seconds:g} s.",
                    ) from None
                raise

    def _prepare(
        self,
        request: IngestRequest,
        media_type: str,
        corpus: Corpus,
        settings: ChunkingSettings,
        context: RequestContext,
        deadline: _Deadline,
    ) -> PreparedDocument:
        recipe = counter_recipe(corpus.embedding)
        if self.parse_pool is None:
            extracted: object = extract_document(
                request.data,
                media_type,
                title=request.title,
                limits=self.ingest_limits,
                cancel=context.cancel,
            )
        else:
            task = ParseTask(
                request.data,
                media_type,
                request.source_id,
                request.revision,
                request.title,
                request.metadata,
                settings,
                self.ingest_limits,
                recipe,
                cpu_seconds=math.ceil(deadline.remaining()) + 1,
            )
            extracted = self.parse_pool.parse(task, context.cancel)
        if isinstance(extracted, PreparedDocument):
            return extracted
        assert isinstance(extracted, Extracted)
        # Cut here: the adapter's counter cannot travel to a worker (or there is no pool).
        return finish_document(
            extracted,
            media_type,
            input_bytes=len(request.data),
            source_id=request.source_id,
            revision=request.revision,
            title=request.title,
            metadata=request.metadata,
            token_counter=corpus.embedding.count_tokens,
            settings=settings,
            limits=self.ingest_limits,
            cancel=context.cancel,
        )

"""RetrievalService: the in-process index/search/delete operations over configured corpora."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import CommitEvent, Corpus, utc_now
from retrieval_host.core.descriptor import (
    check_label,
)
from retrieval_host.core.errors import (
    ErrorCode,
    RetrievalError,
    source_unavailable,
    store_read_only,
)
from retrieval_host.core.fingerprint import joined_text, revision_fingerprint, sha256_text
from retrieval_host.core.grants import (
    GRANT_ATTEMPTS,
    ask_again,
    authorize,
    authorize_or_none,
    denied,
    overtaken,
    require_index_grant,
    searchable,
    searchable_again,
)
from retrieval_host.core.indexing import embed_passages, passage_contexts
from retrieval_host.core.inspection import (
    DEFAULT_PAGE_LIMIT,
    CorpusSummary,
    Passage,
    SourceDetail,
    SourceFilter,
    SourcePage,
    SourceTotals,
    check_page_limit,
)
from retrieval_host.core.lifecycle import run_retrieval
from retrieval_host.core.models import (
    DeleteRequest,
    DeleteResult,
    EmbeddingUsage,
    IndexRequest,
    IndexResult,
    SearchRequest,
    SearchResult,
    SourceRef,
)
from retrieval_host.core.passage_context import embedding_text
from retrieval_host.core.passage_reads import read_passage
from retrieval_host.core.ports import (
    ANY_REVISION,
    Grant,
    StoredChunk,
    StoredSource,
)
from retrieval_host.core.query_embedding import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_MAX_WAIT_S,
    QueryEmbedder,
)
from retrieval_host.core.reasons import (
    CapacityExceededReason,
    InvalidRequestReason,
    SourceConflictReason,
)
from retrieval_host.core.rerank import wants_rerank
from retrieval_host.core.search import CorpusSearch
from retrieval_host.core.source_reads import read_source, read_sources
from retrieval_host.core.validation import check_id, check_index_request

# `Corpus` and `CommitEvent` live in `core.corpus`; importing them from here keeps working.
__all__ = ["CommitEvent", "Corpus", "RetrievalService", "utc_now"]


class RetrievalService:
    """The driver's retrieval operations. Synchronous; callers run it off their event loop.

    Every operation asks the application's authorizer, and asks again after reading and before
    committing: these are point-in-time checks, so a revocation landing between the second check
    and the caller reading the answer is not retracted.

    Search queries are embedded through one `QueryEmbedder` per embedding adapter: concurrent
    queries in one model call (waiting at most `query_batch_wait_s` for company), repeated ones
    from a cache of `query_cache_entries` vectors per service (0 turns it off).
    """

    def __init__(
        self,
        corpora: Sequence[Corpus],
        *,
        clock: Callable[[], str] = utc_now,
        query_cache_entries: int = DEFAULT_CACHE_ENTRIES,
        query_batch_wait_s: float = DEFAULT_MAX_WAIT_S,
    ) -> None:
        self._corpora: dict[str, Corpus] = {}
        self._queries: dict[int, QueryEmbedder] = {}
        self._search = CorpusSearch(
            self.corpus,
            self._query_embedder,
            lambda: self._clock(),
        )
        for corpus in corpora:
            check_label("corpus id", corpus.id)
            if corpus.id in self._corpora:
                raise RetrievalError(ErrorCode.INVALID_REQUEST, f"duplicate corpus {corpus.id!r}")
            # A chunking or lexical setting the configuration leaves unset takes the stored
            # corpus's.
            corpus = corpus.resolved(corpus.store.stored_descriptor(corpus.id))
            # Checked here, before anything can embed: an incompatible descriptor never gets
            # as far as spending an embedding request.
            corpus.store.open_corpus(corpus.descriptor)
            self._corpora[corpus.id] = corpus
            queries = corpus.query_embedding or corpus.embedding
            if queries.descriptor != corpus.embedding.descriptor:
                raise RetrievalError(
                    ErrorCode.INVALID_REQUEST,
                    f"corpus {corpus.id!r}: its query embedding is another model "
                    "than its passages' embedding",
                )
            if id(queries) not in self._queries:
                self._queries[id(queries)] = QueryEmbedder(
                    queries,
                    cache_entries=query_cache_entries,
                    max_wait_s=query_batch_wait_s,
                )
        self._clock = clock

    def _query_embedder(self, corpus: Corpus) -> QueryEmbedder:
        """The batching, caching embedder of the corpus's search queries."""
        return self._queries[id(corpus.query_embedding or corpus.embedding)]

    @property
    def corpora(self) -> Mapping[str, Corpus]:
        return dict(self._corpora)

    def _writable(self, corpus_id: str) -> Corpus:
        """The corpus, or `STORE_READ_ONLY` when its store takes no writes (after the same
        denial as `corpus` for one that does not exist)."""
        corpus = self.corpus(corpus_id)
        if corpus.store.read_only:
            raise store_read_only(corpus.id)
        return corpus

    def corpus(self, corpus_id: str) -> Corpus:
        corpus = self._corpora.get(corpus_id)
        if corpus is None:
            # Same answer as a denied grant: callers cannot probe which corpora exist.
            raise denied()
        return corpus

    # --- search ----------------------------------------------------------------------------

    def reranks(self, corpus_id: str, requested: bool | None) -> bool:
        """Whether a search of that corpus with `rerank=requested` calls the reranker (a run
        draws each such call on its budget before searching)."""
        return wants_rerank(self.corpus(corpus_id).reranker, requested)

    def search_calls_no_model(self, request: SearchRequest, subject: str) -> bool:
        """Whether a search would call neither an embedding model nor a reranker right now:
        lexical, or a query vector this subject's cache holds, on a corpus that does not
        rerank it (a peek for the HTTP layer's choice of thread, `http/policy.py`; the search
        itself decides again, and a vector evicted in between is embedded as usual)."""
        corpus = self._corpora.get(request.corpus)
        if corpus is None or (corpus.reranker is not None and request.rerank is not False):
            return False
        if request.mode == "lexical":
            return True
        return self._query_embedder(corpus).cached(request.query, subject)

    def search_context(self, request: SearchRequest, context: RequestContext) -> SearchResult:
        """Authorized search of one corpus: the lifecycle's steps (`core.search.CorpusSearch`)
        run by `core.lifecycle.run_retrieval`, like every retrieval."""
        return run_retrieval(self._search, request, context).result

    def current_grant(
        self, corpus_id: str, source_ids: Sequence[str] | None, context: RequestContext
    ) -> Grant | None:
        """The application's search grant right now (None when denied): for point-in-time
        rechecks of evidence that was read earlier, e.g. before each generation step."""
        corpus = self.corpus(corpus_id)
        ids = tuple(dict.fromkeys(source_ids)) if source_ids is not None else None
        return authorize_or_none(corpus, "search", ids, context)

    # --- index -----------------------------------------------------------------------------

    def preauthorize_index(
        self, corpus_id: str, source_id: str, revision: str | None, context: RequestContext
    ) -> None:
        """Refuse early, before costly work for an index (parsing a raw document), when the
        subject may not index this source at all: the answers `index_context` would give
        (`PERMISSION_DENIED` for no grant, the one `SOURCE_UNAVAILABLE` for a source or
        revision outside it). `revision` None accepts any granted revision (it is derived
        from the content later). `index_context` decides again at commit. A read-only store
        is `STORE_READ_ONLY` before anything else."""
        corpus = self._writable(corpus_id)
        grant = authorize(corpus, "index", (source_id,), context)
        if revision is None:
            if source_id not in grant.sources:
                raise source_unavailable()
        else:
            require_index_grant(grant, source_id, revision)

    def index_context(self, request: IndexRequest, context: RequestContext) -> IndexResult:
        check_index_request(request)
        corpus = self._writable(request.corpus)
        source = request.source
        limits = corpus.limits
        if len(request.chunks) > limits.max_passages_per_source:
            raise RetrievalError(
                ErrorCode.CAPACITY_EXCEEDED,
                f"a source may have at most {limits.max_passages_per_source} passages.",
                reason=CapacityExceededReason.PASSAGES_PER_SOURCE,
            )
        if any(len(c.text.encode("utf-8")) > limits.max_passage_bytes for c in request.chunks):
            raise RetrievalError(
                ErrorCode.CAPACITY_EXCEEDED,
                f"a passage may have at most {limits.max_passage_bytes} bytes.",
                reason=CapacityExceededReason.PASSAGE_BYTES,
            )

        grant = authorize(corpus, "index", (source.id,), context)
        require_index_grant(grant, source.id, source.revision)

        document_sha256 = request.document_sha256 or sha256_text(joined_text(request.chunks))
        fingerprint = revision_fingerprint(source, request.chunks, document_sha256)
        existing = corpus.store.get_source(corpus.id, grant.namespace, source.id)
        ref = SourceRef(source.id, source.revision)
        if existing is not None and existing.revision == source.revision:
            if existing.fingerprint == fingerprint:
                _notify(corpus, "index", grant.namespace, source.id, source.revision, context)
                return IndexResult(
                    corpus.id,
                    ref,
                    "unchanged",
                    existing.chunk_count,
                    existing.document_sha256,
                    None,
                    EmbeddingUsage(),
                )
            raise _content_differs()

        texts = [c.text for c in request.chunks]
        contexts, too_long = passage_contexts(
            corpus.embedding, corpus.chunking, source, request.chunks, context
        )
        if too_long:
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"{len(too_long)} passage(s) exceed the embedding model's "
                f"{corpus.embedding.max_input_tokens} tokens and would be cut; split them.",
                reason=InvalidRequestReason.PASSAGE_TOO_LONG,
            )
        embedded = [embedding_text(x, t) for x, t in zip(contexts, texts, strict=True)]
        batch = embed_passages(corpus.embedding, embedded, corpus.id, context)
        context.cancel.check()

        # The grant is checked once more right before the commit: embedding can take long.
        require_index_grant(
            authorize(corpus, "index", (source.id,), context),
            source.id,
            source.revision,
            namespace=grant.namespace,
        )
        stored = StoredSource(
            source_id=source.id,
            revision=source.revision,
            title=source.title,
            metadata=source.metadata,
            document_sha256=document_sha256,
            fingerprint=fingerprint,
            chunk_count=len(request.chunks),
            media_type=request.media_type,
            indexed_at=self._clock(),
        )
        chunks = [
            StoredChunk(c.id, i, c.text, c.location, batch.vectors[i], contexts[i])
            for i, c in enumerate(request.chunks)
        ]
        context.report("index.commit", corpus=corpus.id, total=len(chunks))
        try:
            corpus.store.replace_source(
                corpus.id,
                grant.namespace,
                stored,
                chunks,
                expected_revision=existing.revision if existing is not None else None,
                limits=limits,
            )
        except RetrievalError as exc:
            if exc.code is not ErrorCode.SOURCE_CONFLICT:
                raise
            # Another writer committed first. If it committed exactly this revision with
            # exactly this content (a parallel bulk ingest of the same file), the request's
            # outcome is the one an identical re-index gets: `unchanged`, whatever the
            # interleaving. Checked here, over the store's committed state, for every store.
            winner = corpus.store.get_source(corpus.id, grant.namespace, source.id)
            if winner is None or winner.revision != source.revision:
                raise
            if winner.fingerprint != fingerprint:
                raise _content_differs() from exc
            _notify(corpus, "index", grant.namespace, source.id, source.revision, context)
            # The embedding was spent before the race was lost: usage reports it.
            return IndexResult(
                corpus.id,
                ref,
                "unchanged",
                winner.chunk_count,
                winner.document_sha256,
                None,
                batch.usage,
            )
        _notify(corpus, "index", grant.namespace, source.id, source.revision, context)
        return IndexResult(
            corpus.id,
            ref,
            "indexed",
            len(chunks),
            document_sha256,
            existing.revision if existing is not None else None,
            batch.usage,
        )

    # --- delete ----------------------------------------------------------------------------

    def delete_context(self, request: DeleteRequest, context: RequestContext) -> DeleteResult:
        """Delete exactly the revision the request names, which the grant must name too.
        `SOURCE_UNAVAILABLE` for a source the grant leaves out (missing and not deletable look
        alike); for one it grants at another revision, `_stale_delete`'s answer. The store
        answers the same two when the source changed after the grant."""
        check_id("corpus", request.corpus)
        check_id("source id", request.source_id)
        check_id("revision", request.revision)
        if request.revision == ANY_REVISION:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "a delete names an exact revision.")
        corpus = self._writable(request.corpus)
        grant = authorize(corpus, "delete", (request.source_id,), context)
        granted = grant.sources.get(request.source_id)
        if granted is None or granted == ANY_REVISION:  # `*` grants no delete
            raise source_unavailable()
        context.cancel.check()
        if granted != request.revision:
            raise _stale_delete(corpus, grant, request, context)
        removed = corpus.store.delete_source(
            corpus.id, grant.namespace, request.source_id, request.revision
        )
        _notify(corpus, "delete", grant.namespace, request.source_id, request.revision, context)
        reclamation = corpus.store.reclamation
        return DeleteResult(
            corpus.id,
            SourceRef(request.source_id, request.revision),
            removed,
            reclamation if reclamation in ("overwritten", "pending") else "unknown",  # type: ignore[arg-type]
        )

    # --- inspection ------------------------------------------------------------------------
    # Authorized exactly as a search without source ids (`_authorize` of `search`, then only
    # the granted sources at their granted revision), and checked again after the read.

    def list_corpora(
        self, context: RequestContext, corpus_ids: Collection[str] | None = None
    ) -> list[CorpusSummary]:
        """The corpora the subject may search (of `corpus_ids`, when given), by id, with counts
        over the sources visible to it. A corpus the authorizer denies is left out, exactly
        as one that does not exist."""
        summaries = []
        for corpus_id in sorted(self._corpora):
            if corpus_ids is not None and corpus_id not in corpus_ids:
                continue
            corpus = self._corpora[corpus_id]
            counted = self._corpus_totals(corpus, context)
            if counted is None:
                continue
            totals = counted
            summaries.append(
                CorpusSummary(
                    corpus.id,
                    corpus.version,
                    corpus.embedding.descriptor,
                    totals.sources,
                    totals.passages,
                    totals.bytes,
                    corpus.store.read_only,
                )
            )
        return summaries

    def _corpus_totals(self, corpus: Corpus, context: RequestContext) -> SourceTotals | None:
        """The totals over what the subject may search, of one read the check after it
        confirms; None when the authorizer denies, before or after the read.

        A read the after-read check contradicts is authorized and made again, whole, at most
        `GRANT_ATTEMPTS` times: a source replaced meanwhile (`overtaken`) was left out of the
        counts (a black-box test: 60 times in 2,684 reads at 1-2 commits a second), and one
        the check no longer grants (deleted, revoked) was still counted. Unlike a listing, the
        totals are sums, so leaving a source out takes another read, which needs its own
        check: a recount at the first grant's revisions after the check left out a source
        replaced meanwhile while another was deleted (a black-box test: 11-50 of 1,200-4,600
        reads). When the attempts run out, the answer is what the last read gives: an
        overtaken source left out, as searches and listings do, and the sources the last check
        no longer grants never counted."""
        attempt, previous = 1, dict[str, str]()
        while True:
            grant = authorize_or_none(corpus, "search", None, context)
            if grant is None:
                return None
            context.cancel.check()
            granted = searchable(grant)
            totals = corpus.store.source_totals(corpus.id, grant.namespace, granted)
            again = searchable_again(corpus, None, grant, context)
            if again is None:
                return None
            stale = overtaken(granted, again)
            gone = granted.keys() - again.keys()
            if not stale and not gone:
                return totals
            if ask_again(stale, previous, attempt) or (gone and attempt < GRANT_ATTEMPTS):
                previous, attempt = stale, attempt + 1
                continue
            if not gone:
                return totals
            kept = {sid: rev for sid, rev in granted.items() if again.get(sid) == rev}
            return corpus.store.source_totals(corpus.id, grant.namespace, kept)

    def list_sources(
        self,
        corpus_id: str,
        context: RequestContext,
        *,
        limit: int = DEFAULT_PAGE_LIMIT,
        cursor: str | None = None,
        where: SourceFilter | None = None,
    ) -> SourcePage:
        """One page of the sources the subject may search, at their authorized revision,
        ordered by source id, that `where` keeps; `next_cursor` continues it (None after the
        last page). `INVALID_REQUEST`: `limit` outside 1..1000 (`page-limit`), a cursor this
        listing did not return (`invalid-cursor`)."""
        check_page_limit(limit)
        return read_sources(self.corpus(corpus_id), context, where or SourceFilter(), cursor, limit)

    def get_source(
        self,
        corpus_id: str,
        source_id: str,
        context: RequestContext,
        *,
        limit: int = DEFAULT_PAGE_LIMIT,
        cursor: str | None = None,
    ) -> SourceDetail:
        """One source at its authorized revision with one page of its passages by ordinal.
        A missing source and one the subject may not search give the one
        `SOURCE_UNAVAILABLE`; a cursor of a revision that is no longer the source's answers
        `SOURCE_CONFLICT` (`revision-changed`): start again without it."""
        check_page_limit(limit)
        check_id("source id", source_id)
        return read_source(self.corpus(corpus_id), source_id, context, cursor, limit)

    def get_passage(
        self,
        corpus_id: str,
        chunk_id: str,
        context: RequestContext,
        *,
        revision: str | None = None,
    ) -> Passage:
        """The passage with that chunk id as a search hit shows it, authorized now: the read
        behind a saved citation. A missing passage, one of a revision that is no longer
        current or no longer granted, give the one `SOURCE_UNAVAILABLE`; so does one whose
        source is no longer at `revision` (the citation's), when it is given: a new revision
        may reuse a chunk id for other text."""
        check_id("chunk id", chunk_id)
        if revision is not None:
            check_id("revision", revision)
        return read_passage(self.corpus(corpus_id), chunk_id, revision, context, self._clock)


def _notify(
    corpus: Corpus,
    operation: Literal["index", "delete"],
    namespace: str,
    source_id: str,
    revision: str,
    context: RequestContext,
) -> None:
    if corpus.on_committed is not None:
        corpus.on_committed(
            CommitEvent(operation, corpus.id, namespace, source_id, revision, context.subject)
        )


def _stale_delete(
    corpus: Corpus, grant: Grant, request: DeleteRequest, context: RequestContext
) -> RetrievalError:
    """The answer to a delete whose grant names another revision of the source than the
    request: `SOURCE_CONFLICT` (`stale-revision`) when the store holds the source, so the
    writer fetches its current revision and retries, as the store answers a granted delete
    of a replaced revision; the one `SOURCE_UNAVAILABLE` when it holds none. The example
    application grants the store's current revision, so this is how its writers learn that
    another replaced the source (a black-box test: every stale delete answered 404, as for a
    source never stored). Only the holder of a delete grant on the source learns whether it is
    stored, and only if the check after the read still grants it one."""
    stored = corpus.store.current_revisions(corpus.id, grant.namespace, (request.source_id,))
    if request.source_id not in stored:
        return source_unavailable()
    again = authorize(corpus, "delete", (request.source_id,), context)
    if again.namespace != grant.namespace or again.sources.get(request.source_id) in (
        None,
        ANY_REVISION,
    ):
        return source_unavailable()
    # The store's own words for the same conflict (`adapters._store_rules.stale_revision`).
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT,
        "the source is at another revision; delete names the exact current revision.",
        reason=SourceConflictReason.STALE_REVISION,
    )


def _content_differs() -> RetrievalError:
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT,
        "this revision is already indexed with different content or provenance; "
        "index the change under a new revision.",
        reason=SourceConflictReason.REVISION_CONTENT_DIFFERS,
    )

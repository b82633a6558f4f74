"""`search_context` as the retrieval lifecycle's steps (`core.lifecycle`), pure.

- prepare: the request checked, its filters parsed, its corpus and source ids resolved;
- assert input: the request's own rules (`check_search_request`);
- authorize: the application's grant, narrowed to the requested sources (a source missing or
  at another revision looks exactly like an unauthorized one), then to fresh revisions;
- execute: the ranking over the allowed revisions only (`core.ranking.rank`);
- assert result: the grant asked again after the read (a candidate whose revision is no longer
  granted is dropped), then reranking (only passages the caller may read leave the host), the
  corpus's ranking policy, `minScore`, the limit and the byte budget.

A source replaced while a search runs. An authorizer grants the revision that is current when
it answers; a writer can commit the next one before the read. The read then finds nothing of
that source at the granted revision (or finds passages the after-read grant no longer names),
and the search would answer `SOURCE_UNAVAILABLE` or leave the source out although it was
readable all along, at one revision or the other. So when the store (before the read) or the
after-read grant holds a granted source at another revision (`core.grants.overtaken`), the
search authorizes and reads again, whole: at most `GRANT_ATTEMPTS` authorizations before a
read in all, and stopping early when the authorizer grants the same overtaken revisions again
(it does not follow the store; asking more would not help). Then the answer is what one
attempt gives, except that a search naming its sources (`sourceIds`) whose last read was
overtaken too answers `SOURCE_UNAVAILABLE` rather than leave a named source out as if nothing
in it matched. A deleted or revoked source is not retried (a named one answers
`SOURCE_UNAVAILABLE`, as it would a moment later). The passages returned are always
those of the last read, checked against the grant asked after it: never a revision it does not
name, never two revisions of one source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from retrieval_host.core.budget import apply_byte_budget
from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import permission_denied, source_unavailable
from retrieval_host.core.filters import MetadataFilter, parse_filter
from retrieval_host.core.freshness import fresh_revisions
from retrieval_host.core.grants import (
    GRANT_ATTEMPTS,
    ask_again,
    authorize,
    authorize_or_none,
    overtaken,
    searchable,
)
from retrieval_host.core.models import (
    EmbeddingUsage,
    Hit,
    RerankUsage,
    Scope,
    SearchRequest,
    SearchResult,
    SourceRef,
)
from retrieval_host.core.passage_metadata import passage_metadata
from retrieval_host.core.ports import Candidate
from retrieval_host.core.query_embedding import QueryEmbedder
from retrieval_host.core.ranking import apply_policy, rank
from retrieval_host.core.rerank import rerank_candidates, wants_rerank
from retrieval_host.core.validation import check_search_request


@dataclass(frozen=True, slots=True)
class PreparedSearch:
    request: SearchRequest
    corpus: Corpus
    source_ids: tuple[str, ...] | None
    where: MetadataFilter | None


@dataclass(frozen=True, slots=True)
class SearchGrant:
    namespace: str
    allowed: Mapping[str, str]  # source id -> the one revision it may be read at
    scope: Scope
    retrieved_at: str
    reranking: bool
    # The revisions the authorizer granted for this search's sources, before freshness: what
    # the after-read grant is compared with to see a source replaced meanwhile.
    granted: Mapping[str, str]
    attempt: int  # authorizations before a read this search has made, this one included


@dataclass(frozen=True, slots=True)
class Found:
    candidates: list[Candidate]
    scores: dict[str, dict[str, float]]
    usage: EmbeddingUsage


class CorpusSearch:
    """The host's own search of a corpus (`Retrieval[SearchRequest, ..., SearchResult]`)."""

    name = "search_context"

    def __init__(
        self,
        corpus: Callable[[str], Corpus],
        queries: Callable[[Corpus], QueryEmbedder],
        clock: Callable[[], str],
    ) -> None:
        self._corpus = corpus
        self._queries = queries
        self._clock = clock

    def prepare(self, request: SearchRequest, context: RequestContext) -> PreparedSearch:
        check_search_request(request)  # before parsing filters: its errors come first
        where = parse_filter(request.filters) if request.filters is not None else None
        ids = tuple(dict.fromkeys(request.source_ids)) if request.source_ids is not None else None
        return PreparedSearch(request, self._corpus(request.corpus), ids, where)

    def assert_input(self, prepared: PreparedSearch) -> None:
        check_search_request(prepared.request)

    def authorize(self, prepared: PreparedSearch, context: RequestContext) -> SearchGrant:
        return self._authorize(prepared, context, 1)

    def _authorize(
        self, prepared: PreparedSearch, context: RequestContext, attempt: int
    ) -> SearchGrant:
        """The grant of read number `attempt`, asked again (up to `GRANT_ATTEMPTS`) while the
        store holds a granted source at another revision than the granted one."""
        corpus, ids = prepared.corpus, prepared.source_ids
        max_age = prepared.request.max_age_s
        previous: dict[str, str] = {}  # what the last attempt found overtaken
        while True:
            context.report("retrieval.authorization", corpus=corpus.id, check="before-read")
            grant = authorize(corpus, "search", ids, context)
            granted = searchable(grant)
            if ids is not None:
                if any(sid not in granted for sid in ids):
                    raise source_unavailable()
                granted = {sid: granted[sid] for sid in ids}
                stored: dict[str, str] = {}
                for sid in granted:
                    source = corpus.store.get_source(corpus.id, grant.namespace, sid)
                    if source is None:
                        raise source_unavailable()  # missing looks exactly like unauthorized
                    stored[sid] = source.revision
                stale = overtaken(granted, stored)
                if ask_again(stale, previous, attempt):
                    previous, attempt = stale, attempt + 1
                    context.cancel.check()
                    continue
                if stale:
                    raise source_unavailable()  # so does another revision than the granted
            # After the grant (a denied caller learns nothing of the corpus), before any result:
            # insisting on a reranker the corpus lacks is refused whatever the grant holds.
            reranking = wants_rerank(corpus.reranker, prepared.request.rerank)
            retrieved_at = self._clock()
            allowed = granted
            if max_age is not None and allowed:
                # With authorization, before ranking: a stale revision is never scored.
                indexed = corpus.store.indexed_at(corpus.id, grant.namespace, allowed.keys())
                stale = overtaken(granted, {sid: found[0] for sid, found in indexed.items()})
                if ask_again(stale, previous, attempt):
                    previous, attempt = stale, attempt + 1
                    context.cancel.check()
                    continue
                allowed = fresh_revisions(allowed, indexed, retrieved_at, max_age)
            scope = Scope(corpus.id, corpus.version, grant.namespace)
            return SearchGrant(
                grant.namespace, allowed, scope, retrieved_at, reranking, granted, attempt
            )

    def execute(
        self, prepared: PreparedSearch, grant: SearchGrant, context: RequestContext
    ) -> Found:
        if not grant.allowed:
            return Found([], {}, EmbeddingUsage())
        request, corpus = prepared.request, prepared.corpus
        # One more than the limit tells `truncated`; a reranked search sends more to rerank.
        wanted = request.limit + 1
        if grant.reranking:
            wanted = max(wanted, corpus.rerank.candidates)
        ranked, usage = rank(
            corpus,
            grant.namespace,
            grant.allowed,
            request,
            prepared.where,
            wanted,
            context,
            self._queries(corpus),
        )
        scores = {r.candidate.chunk_id: dict(r.scores) for r in ranked}
        return Found([r.candidate for r in ranked], scores, usage)

    def assert_result(
        self,
        prepared: PreparedSearch,
        grant: SearchGrant,
        found: Found,
        context: RequestContext,
    ) -> SearchResult:
        request, corpus = prepared.request, prepared.corpus
        while True:
            if not grant.allowed:
                return SearchResult([], False, grant.retrieved_at, grant.scope, found.usage)
            context.report("retrieval.authorization", corpus=corpus.id, check="after-read")
            recheck = authorize_or_none(corpus, "search", prepared.source_ids, context)
            # Once per check: a grant may list every source of a large corpus.
            current = {} if recheck is None else searchable(recheck)
            if (
                grant.attempt >= GRANT_ATTEMPTS
                or recheck is None
                or recheck.namespace != grant.namespace
                or not (
                    overtaken(grant.granted, current)
                    or (prepared.source_ids is None and _vanished(found, current))
                )
            ):
                break
            # A source was replaced between the grant and this check: the read missed it, or
            # found passages of the revision now gone. Or one the read found was deleted: its
            # passages took places in the `limit + 1` read that other sources' matches must
            # fill (a probe saw empty answers, `truncated: false`, beside a deleting writer).
            # Authorize and read again, whole.
            context.cancel.check()
            grant = self._authorize(prepared, context, grant.attempt + 1)
            context.cancel.check()
            spent = found.usage
            found = self.execute(prepared, grant, context)
            found = replace(found, usage=spent + found.usage)
            context.cancel.check()
        candidates = found.candidates
        if prepared.source_ids is not None:
            # A named source must not be left out as if nothing in it matched (a black-box
            # test saw empty 200s): answer what a search a moment later would.
            if recheck is None:
                raise permission_denied()  # the subject may no longer search the corpus
            if (
                recheck.namespace != grant.namespace
                or overtaken(grant.granted, current)
                or any(sid not in current for sid in grant.granted)
            ):
                # Overtaken again, or deleted or revoked since it was granted.
                raise source_unavailable()
        lost = False
        times: Mapping[str, tuple[str, str | None]] = {}
        if recheck is None or recheck.namespace != grant.namespace:
            candidates = []
        else:
            # The store's sources too: an application's grant may still list a source deleted
            # since the read (its own records lag the store's), and deleted passages stop
            # appearing once the delete commits (SPEC 3.4). A source replaced since the check
            # answers the revision the check granted, as before: that one is whole.
            times = corpus.store.indexed_at(
                corpus.id, grant.namespace, {c.source_id for c in candidates}
            )
            stored = [c for c in candidates if c.source_id in times]
            if prepared.source_ids is not None and len(stored) < len(candidates):
                raise source_unavailable()  # named, and deleted since the read
            candidates = [c for c in stored if recheck.sources.get(c.source_id) == c.revision]
            # Passages dropped here (the last attempt was overtaken too) may have hidden
            # matches the read did not reach: the answer does not claim to be whole. Unless
            # each scored under `minScore`: what the read did not reach scores lower still.
            # Not when reranked: the floor then applies to the reranker's scores, which the
            # dropped passages never got (probe V, session 37).
            remaining = {c.chunk_id for c in candidates}
            floor = None if grant.reranking else request.min_score
            lost = any(
                c.chunk_id not in remaining and (floor is None or c.score >= floor)
                for c in found.candidates
            )
        scores = found.scores
        rerank_usage = RerankUsage()
        if grant.reranking and candidates and corpus.reranker is not None:
            # After the second check: only passages the caller may read leave the host.
            context.report("retrieval.rerank", corpus=corpus.id, documents=len(candidates))
            candidates, reranked, rerank_usage = rerank_candidates(
                corpus.reranker, request.query, candidates, context.cancel
            )
            for chunk_id, value in reranked.items():
                scores[chunk_id]["rerank"] = value
        if corpus.ranking_policy is not None:
            candidates = apply_policy(corpus.ranking_policy, request.query, candidates)
        if request.min_score is not None:
            candidates = [c for c in candidates if c.score >= request.min_score]

        shown = candidates[: request.limit]
        hits = [
            Hit(
                chunk_id=c.chunk_id,
                source=SourceRef(c.source_id, c.revision),
                location=c.location,
                text=c.text,
                document_sha256=c.document_sha256,
                score=c.score,
                retrieved_at=grant.retrieved_at,
                scope=grant.scope,
                scores=scores[c.chunk_id],
                metadata=passage_metadata(c.metadata, c.location, c.text, media_type=c.media_type),
                indexed_at=_indexed_at(times, c.source_id, c.revision),
            )
            for c in shown
        ]
        kept, dropped = apply_byte_budget(hits, request.max_context_bytes)
        truncated = dropped or lost or len(candidates) > request.limit
        return SearchResult(
            kept, truncated, grant.retrieved_at, grant.scope, found.usage, rerank_usage
        )


def _vanished(found: Found, current: Mapping[str, str]) -> bool:
    """Whether the read found passages of a source no longer searchable (deleted, revoked)."""
    return any(c.source_id not in current for c in found.candidates)


def _indexed_at(
    times: Mapping[str, tuple[str, str | None]], source_id: str, revision: str
) -> str | None:
    """A hit's commit time, when the store still has its revision current."""
    found = times.get(source_id)
    return found[1] if found is not None and found[0] == revision else None

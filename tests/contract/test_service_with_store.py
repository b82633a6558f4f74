"""RetrievalService over each store adapter with the real local embedding model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from retrieval_host.adapters.embedding_local import MODEL_NAME, LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.fusion import FusionSettings, for_model
from retrieval_host.core.indexing import COUNT_SLICE
from retrieval_host.core.models import (
    ChunkInput,
    DeleteRequest,
    EmbeddingUsage,
    IndexRequest,
    Location,
    Operation,
    SearchMode,
    SearchRequest,
    SearchResult,
    SourceInfo,
)
from retrieval_host.core.ports import (
    ANY_REVISION,
    AuthorizationRequest,
    Candidate,
    EmbeddingBatch,
    Grant,
)
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness

PASSAGES = {
    "a": ["Otters hold hands while they sleep.", "Sea otters use rocks as tools."],
    "b": ["The invoice is due within thirty days.", "Late payments accrue interest."],
}


@dataclass
class GrantBook:
    """The application's authorizer for a test: one grant per operation, changeable."""

    grants: dict[Operation, Grant | None] = field(default_factory=dict)
    calls: list[AuthorizationRequest] = field(default_factory=list)

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        self.calls.append(request)
        return self.grants.get(request.operation)


@dataclass
class Setup:
    service: RetrievalService
    book: GrantBook
    store_kind: str


@pytest.fixture
def setup(harness: StoreHarness, local_embedding: LocalEmbedding) -> Setup:
    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION, "b": ANY_REVISION})
    corpus = Corpus("docs", "passages-v1", local_embedding, harness.open(), book)
    return Setup(RetrievalService([corpus]), book, harness.kind)


def ctx() -> RequestContext:
    return RequestContext(subject="user-1")


def index_request(source_id: str, rev: str, texts: list[str] | None = None) -> IndexRequest:
    texts = texts if texts is not None else PASSAGES[source_id]
    return IndexRequest(
        "docs",
        SourceInfo(source_id, rev, title=f"{source_id} title", metadata={"kind": "note"}),
        [
            ChunkInput(f"{source_id}-{i}", t, Location(start_line=i + 1, end_line=i + 1))
            for i, t in enumerate(texts)
        ],
    )


def test_an_identical_reindex_is_unchanged_and_embeds_nothing(setup: Setup) -> None:
    first = setup.service.index_context(index_request("a", "r1"), ctx())
    again = setup.service.index_context(index_request("a", "r1"), ctx())
    assert first.status == "indexed"
    assert first.usage.requests == 1
    assert again.status == "unchanged"
    assert again.usage == EmbeddingUsage()
    assert (again.chunk_count, again.document_sha256) == (2, first.document_sha256)


def test_changed_content_under_the_same_revision_is_a_conflict(setup: Setup) -> None:
    setup.service.index_context(index_request("a", "r1"), ctx())
    changed = index_request("a", "r1", ["Otters hold hands while they nap.", "Rocks."])
    with pytest.raises(RetrievalError) as excinfo:
        setup.service.index_context(changed, ctx())
    assert excinfo.value.code is ErrorCode.SOURCE_CONFLICT

    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    result = setup.service.search_context(SearchRequest("docs", "otters"), ctx())
    assert sorted(h.text for h in result.hits) == sorted(PASSAGES["a"])


def test_a_new_revision_replaces_the_old_and_delete_reports_reclamation(setup: Setup) -> None:
    setup.service.index_context(index_request("a", "r1"), ctx())
    result = setup.service.index_context(index_request("a", "r2", ["Only otters now."]), ctx())
    assert (result.status, result.replaced_revision) == ("indexed", "r1")

    setup.book.grants["search"] = Grant("team", {"a": "r2"})
    hits = setup.service.search_context(SearchRequest("docs", "otters"), ctx()).hits
    assert [(h.text, h.source.revision) for h in hits] == [("Only otters now.", "r2")]
    assert hits[0].scope.namespace == "team"

    setup.book.grants["delete"] = Grant("team", {"a": "r2"})
    deleted = setup.service.delete_context(DeleteRequest("docs", "a", "r2"), ctx())
    assert deleted.deleted_chunks == 1
    # SQLite overwrites deleted bytes at once (secure_delete) but its index snapshot only when
    # it is rewritten, in the background; PostgreSQL at VACUUM.
    assert deleted.reclamation == "pending"
    assert setup.service.search_context(SearchRequest("docs", "otters"), ctx()).hits == []


def test_an_unauthorized_and_a_missing_source_give_identical_errors(setup: Setup) -> None:
    setup.service.index_context(index_request("a", "r1"), ctx())
    setup.service.index_context(index_request("b", "r1"), ctx())
    # "b" exists but is not granted; "ghost" is granted but does not exist; "a" is granted at
    # a revision that is not the current one.
    setup.book.grants["search"] = Grant("team", {"a": "r0", "ghost": "r1"})

    def error_for(source_id: str) -> tuple[object, ...]:
        with pytest.raises(RetrievalError) as excinfo:
            setup.service.search_context(
                SearchRequest("docs", "invoice", source_ids=[source_id]), ctx()
            )
        e = excinfo.value
        return (e.code, e.detail, e.reason, str(e), e.status, e.title, e.args)

    unauthorized, missing, stale = error_for("b"), error_for("ghost"), error_for("a")
    assert unauthorized[0] is ErrorCode.SOURCE_UNAVAILABLE
    assert unauthorized == missing == stale


def test_each_search_mode_ranks_and_names_its_scores(setup: Setup) -> None:
    setup.service.index_context(index_request("a", "r1"), ctx())
    setup.service.index_context(index_request("b", "r1"), ctx())
    setup.book.grants["search"] = Grant("team", {"a": "r1", "b": "r1"})

    def search(mode: SearchMode, query: str = "otters rocks") -> SearchResult:
        return setup.service.search_context(SearchRequest("docs", query, mode=mode), ctx())

    dense, lexical, hybrid = search("dense"), search("lexical"), search("hybrid")
    assert SearchRequest("docs", "q").mode == "hybrid"  # the default, in-process as on the wire
    assert dense.usage.requests == 1
    assert hybrid.usage == EmbeddingUsage()  # the same query again: its vector is cached
    assert search("hybrid", "rocks otters").usage.requests == 1
    assert lexical.usage == EmbeddingUsage()  # no query embedding for a lexical search
    # Lexical ranks only passages with a query term, the one with both terms first.
    assert [h.text for h in lexical.hits] == PASSAGES["a"][::-1]
    assert all(
        h.score == h.scores["lexical"] and set(h.scores) == {"lexical"} for h in lexical.hits
    )
    assert all(set(h.scores) == {"dense"} for h in dense.hits)
    # Hybrid keeps every passage dense found, its fused score in [0, 1], both raw scores kept.
    assert sorted(h.chunk_id for h in hybrid.hits) == sorted(h.chunk_id for h in dense.hits)
    assert hybrid.hits[0].text == "Sea otters use rocks as tools."
    assert set(hybrid.hits[0].scores) == {"dense", "lexical"}
    assert all(0.0 <= h.score <= 1.0 for h in hybrid.hits)
    # A limit and the byte budget apply to the fused ranking as before.
    one = setup.service.search_context(
        SearchRequest("docs", "otters rocks", limit=1, mode="hybrid"), ctx()
    )
    assert [h.chunk_id for h in one.hits] == [hybrid.hits[0].chunk_id] and one.truncated
    with pytest.raises(RetrievalError) as excinfo:
        search("fuzzy")  # type: ignore[arg-type]
    assert excinfo.value.code is ErrorCode.INVALID_REQUEST


def test_lexical_and_hybrid_search_ask_the_authorizer_like_dense(setup: Setup) -> None:
    setup.service.index_context(index_request("a", "r1"), ctx())
    setup.service.index_context(index_request("b", "r1"), ctx())
    for mode in ("lexical", "hybrid"):
        setup.book.grants["search"] = Grant("team", {"b": "r1"})
        setup.book.calls.clear()
        hits = setup.service.search_context(
            SearchRequest("docs", "otters invoice", mode=mode),
            ctx(),
        ).hits
        assert {h.source.id for h in hits} == {"b"}
        assert [c.operation for c in setup.book.calls] == ["search", "search"]  # before, after
        setup.book.grants["search"] = None
        with pytest.raises(RetrievalError) as excinfo:
            setup.service.search_context(
                SearchRequest("docs", "otters", mode=mode),
                ctx(),
            )
        assert excinfo.value.code is ErrorCode.PERMISSION_DENIED


class CancelOnCount:
    """The local model, except that counting tokens cancels the request (as an ingest deadline
    firing mid-count does) and records how many passages each count call held."""

    def __init__(self, inner: LocalEmbedding, context: RequestContext) -> None:
        self.inner = inner
        self.context = context
        self.counted: list[int] = []
        self.embedded = 0

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self.inner.descriptor

    @property
    def max_input_tokens(self) -> int:
        return self.inner.max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        self.counted.append(len(texts))
        self.context.cancel.cancel()
        return self.inner.count_tokens(texts)

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        self.embedded += len(texts)
        return self.inner.embed(texts, cancel)


def test_a_cancel_while_counting_stops_before_the_next_slice(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    # Counting a large document's passages took seconds on a loaded host after its ingest
    # deadline had fired: the count now goes a slice at a time and stops at the first check.
    context = ctx()
    counting = CancelOnCount(local_embedding, context)
    book = GrantBook({"index": Grant("team", {"big": ANY_REVISION})})
    service = RetrievalService([Corpus("docs", "passages-v1", counting, harness.open(), book)])
    texts = [f"Passage {i} about harbour fees." for i in range(3 * COUNT_SLICE)]
    with pytest.raises(RetrievalError) as caught:
        service.index_context(index_request("big", "r1", texts), context)
    assert caught.value.code is ErrorCode.CANCELLED
    assert counting.counted == [COUNT_SLICE]
    assert counting.embedded == 0


def test_a_ranking_policy_swapped_in_has_the_last_word_on_the_order(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    class SourceBFirstOnePerSource:
        """Puts source b first and keeps one passage per source; tries to add one of its own."""

        def order(self, query: str, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
            forged = replace(candidates[0], chunk_id="forged", text="Not indexed.")
            firsts: dict[str, Candidate] = {}
            for c in sorted(candidates, key=lambda c: c.source_id != "b"):
                firsts.setdefault(c.source_id, c)
            return [forged, *firsts.values()]

    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION, "b": ANY_REVISION})
    corpus = Corpus(
        "docs",
        "passages-v1",
        local_embedding,
        harness.open(),
        book,
        ranking_policy=SourceBFirstOnePerSource(),
    )
    service = RetrievalService([corpus])
    service.index_context(index_request("a", "r1"), ctx())
    service.index_context(index_request("b", "r1"), ctx())
    book.grants["search"] = Grant("team", {"a": "r1", "b": "r1"})
    hits = service.search_context(SearchRequest("docs", "otters rocks", limit=5), ctx()).hits
    assert [h.source.id for h in hits] == ["b", "a"]
    assert all(h.chunk_id != "forged" for h in hits)
    # Only what the grant allows reaches the policy: with b revoked it never sees b.
    book.grants["search"] = Grant("team", {"a": "r1"})
    hits = service.search_context(SearchRequest("docs", "otters rocks", limit=5), ctx()).hits
    assert [h.source.id for h in hits] == ["a"]


def test_a_source_the_caller_may_not_read_never_moves_lexical_or_hybrid_scores(
    setup: Setup,
) -> None:
    # The black-box finding: BM25 statistics over the whole namespace made a readable
    # passage's score drop when an unreadable source holding the query's words was added,
    # and come back when it was deleted (an oracle for words the caller may not read).
    otters = [f"Otters {word} near the kelp." for word in ("sleep", "swim", "eat", "play")]
    setup.service.index_context(index_request("a", "r1", [*PASSAGES["a"], *otters]), ctx())
    setup.service.index_context(index_request("b", "r1"), ctx())
    setup.book.grants["search"] = Grant("team", {"a": "r1"})

    def scores() -> list[object]:
        seen: list[object] = []
        for mode in ("lexical", "hybrid"):
            request = SearchRequest("docs", "otters rocks tools", limit=3, mode=mode)
            hits = setup.service.search_context(request, ctx()).hits
            seen.append([(h.chunk_id, h.score, dict(h.scores)) for h in hits])
        return seen

    before = scores()
    assert all(hits for hits in before)
    setup.book.grants["index"] = Grant("team", {"hidden": ANY_REVISION})
    hidden = ["Otters, otters: rocks and tools.", "Sea otters with rocks, otters with tools."]
    setup.service.index_context(index_request("hidden", "r1", hidden), ctx())
    assert scores() == before
    setup.book.grants["delete"] = Grant("team", {"hidden": "r1"})
    setup.service.delete_context(DeleteRequest("docs", "hidden", "r1"), ctx())
    assert scores() == before


def test_hybrid_scales_the_local_models_dense_scores_over_at_least_its_floor(
    setup: Setup,
) -> None:
    """`core.ranking` applies the floor measured for the corpus's model (`for_model`): every
    hybrid score is the fusion of the hit's own raw scores with the floor, not plain min-max."""
    setup.service.index_context(index_request("a", "r1"), ctx())
    setup.service.index_context(index_request("b", "r1"), ctx())
    setup.book.grants["search"] = Grant("team", {"a": "r1", "b": "r1"})
    hits = setup.service.search_context(
        SearchRequest("docs", "--file-name interest", mode="hybrid"), ctx()
    ).hits
    assert len(hits) == 4  # every passage is a candidate: the scaling is over these
    dense = {h.chunk_id: h.scores["dense"] for h in hits}
    lexical = {h.chunk_id: h.scores["lexical"] for h in hits}
    band = max(dense.values()) - min(dense.values())
    floor = for_model(FusionSettings(), MODEL_NAME).dense_min_spread
    assert floor == 0.5 and 0 < band < floor  # the case the floor is for
    top = max(lexical.values())
    for h in hits:
        expected = 0.45 * (dense[h.chunk_id] - min(dense.values())) / floor
        expected += 0.55 * (lexical[h.chunk_id] - min(lexical.values())) / top
        assert h.score == pytest.approx(expected, abs=1e-6)

"""Inspection through RetrievalService over every store: authorized exactly as search, paged by
opaque cursors, a missing and an unauthorized source answered alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.inspection import MAX_PAGE_LIMIT, PassageSummary, SourceDetail
from retrieval_host.core.models import ChunkInput, DeleteRequest, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant, VectorStore
from retrieval_host.core.reasons import InvalidRequestReason, SourceConflictReason
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_with_store import GrantBook, Setup, ctx, index_request
from tests.core.test_inspection_cursor import earlier_passages_cursor


@pytest.fixture
def setup(harness: StoreHarness, local_embedding: LocalEmbedding) -> Setup:
    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION, "b": ANY_REVISION})
    corpus = Corpus("docs", "passages-v1", local_embedding, harness.open(), book)
    return Setup(RetrievalService([corpus]), book, harness.kind)


TEXTS = ["Otters hold hands.", "Rivers carry them.", "Kelp forests."]


def _index(setup: Setup, source_id: str, rev: str, texts: list[str] = TEXTS) -> None:
    setup.service.index_context(index_request(source_id, rev, texts), ctx())


def _error(work: object) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        work()  # type: ignore[operator]
    return excinfo.value


def test_list_corpora_counts_only_what_the_subject_may_search(setup: Setup) -> None:
    _index(setup, "a", "r1")
    _index(setup, "b", "r1", TEXTS[:1])
    assert setup.service.list_corpora(ctx()) == []  # no search grant: not listed
    setup.book.grants["search"] = Grant("team", {"a": "r1", "b": "r0"})
    [corpus] = setup.service.list_corpora(ctx())
    assert (corpus.id, corpus.version, corpus.sources, corpus.passages) == (
        "docs",
        "passages-v1",
        1,
        3,
    )
    assert corpus.bytes == sum(len(t.encode()) for t in TEXTS)
    assert corpus.embedding.model
    assert setup.service.list_corpora(ctx(), corpus_ids=["other"]) == []


def test_list_corpora_leaves_out_a_source_revoked_between_its_two_checks(setup: Setup) -> None:
    # A black-box test: a source the after-read check no longer granted kept its passages
    # and bytes in the counts, where listings and searches dropped it.
    _index(setup, "a", "r1", TEXTS[:1])
    _index(setup, "b", "r1")
    before = Grant("team", {"a": "r1", "b": "r1"})
    after = Grant("team", {"a": "r1"})
    asked: list[str] = []

    def revoking(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        asked.append(request.operation)
        return before if len(asked) == 1 else after

    docs = setup.service.corpus("docs")
    service = RetrievalService([dataclasses.replace(docs, authorize=revoking)])
    [corpus] = service.list_corpora(ctx())
    # Read again under the later grant (the totals are sums: leaving b out takes a new read)
    # and checked after it.
    assert len(asked) == 4
    assert (corpus.sources, corpus.passages, corpus.bytes) == (1, 1, len(TEXTS[0].encode()))


def test_list_sources_follows_cursors_over_authorized_sources_only(setup: Setup) -> None:
    for sid in ("a", "b"):
        _index(setup, sid, "r1", [f"{sid} {t}" for t in TEXTS])
    setup.book.grants["search"] = Grant("team", {"a": "r1", "b": "r1", "ghost": "r1"})
    first = setup.service.list_sources("docs", ctx(), limit=1)
    assert [s.id for s in first.sources] == ["a"]
    assert first.next_cursor is not None
    second = setup.service.list_sources("docs", ctx(), limit=1, cursor=first.next_cursor)
    assert [(s.id, s.revision, s.chunk_count) for s in second.sources] == [("b", "r1", 3)]
    assert second.sources[0].title == "b title"
    assert dict(second.sources[0].metadata) == {"kind": "note"}
    assert second.next_cursor is None
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    again = setup.service.list_sources("docs", ctx(), limit=1, cursor=first.next_cursor)
    assert (again.sources, again.next_cursor) == ([], None)


def test_limits_and_tampered_cursors_are_typed_invalid_requests(setup: Setup) -> None:
    _index(setup, "a", "r1")
    _index(setup, "b", "r1", ["Other text."])
    setup.book.grants["search"] = Grant("team", {"a": "r1", "b": "r1"})
    for limit in (0, MAX_PAGE_LIMIT + 1):
        error = _error(lambda: setup.service.list_sources("docs", ctx(), limit=limit))  # noqa: B023
        assert (error.code, error.reason) == (ErrorCode.INVALID_REQUEST, "page-limit")
    cursor = setup.service.list_sources("docs", ctx(), limit=1).next_cursor
    assert cursor is not None
    flip = "0" if cursor[10] != "0" else "1"
    tampered = [cursor[:10] + flip + cursor[11:], cursor[:-4], cursor + "00", "x", "!!!!"]
    for bad in tampered:
        error = _error(lambda: setup.service.list_sources("docs", ctx(), cursor=bad))  # noqa: B023
        assert error.reason == InvalidRequestReason.INVALID_CURSOR
    # A sources cursor does not page passages.
    error = _error(lambda: setup.service.get_source("docs", "a", ctx(), cursor=cursor))
    assert error.reason == InvalidRequestReason.INVALID_CURSOR


def test_a_missing_and_an_unauthorized_source_or_passage_answer_alike(setup: Setup) -> None:
    _index(setup, "a", "r1")
    _index(setup, "b", "r1", ["Hidden."])
    setup.book.grants["search"] = Grant("team", {"a": "r0", "ghost": "r1"})
    answers = [
        _error(lambda: setup.service.get_source("docs", sid, ctx()))  # noqa: B023
        for sid in ("a", "b", "ghost", "nowhere")
    ] + [
        _error(lambda: setup.service.get_passage("docs", cid, ctx()))  # noqa: B023
        for cid in ("a-0", "b-0", "nowhere")
    ]
    assert {str(e) for e in answers} == {str(source_unavailable())}
    assert {e.code for e in answers} == {ErrorCode.SOURCE_UNAVAILABLE}


def test_get_source_pages_its_passages_and_refuses_a_cursor_of_another_revision(
    setup: Setup,
) -> None:
    _index(setup, "a", "r1")
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    detail = setup.service.get_source("docs", "a", ctx(), limit=2)
    assert (detail.source.id, detail.source.revision, detail.source.chunk_count) == ("a", "r1", 3)
    assert [p.chunk_id for p in detail.passages] == ["a-0", "a-1"]
    assert detail.passages[1].bytes == len(TEXTS[1].encode())
    assert detail.next_cursor is not None
    rest = setup.service.get_source("docs", "a", ctx(), limit=2, cursor=detail.next_cursor)
    assert [p.chunk_id for p in rest.passages] == ["a-2"]
    assert rest.next_cursor is None

    _index(setup, "a", "r2", ["New otters.", "New rivers.", "New kelp."])
    setup.book.grants["search"] = Grant("team", {"a": "r2"})
    error = _error(
        lambda: setup.service.get_source("docs", "a", ctx(), limit=2, cursor=detail.next_cursor)
    )
    assert (error.code, error.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        SourceConflictReason.REVISION_CHANGED,
    )


def test_get_passage_reads_a_citation_and_is_reauthorized_at_read(setup: Setup) -> None:
    _index(setup, "a", "r1")
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    passage = setup.service.get_passage("docs", "a-1", ctx())
    assert (passage.text, passage.source.id, passage.source.revision) == (TEXTS[1], "a", "r1")
    assert passage.location.start_line == 2
    assert (passage.scope.corpus, passage.scope.namespace) == ("docs", "team")
    assert passage.retrieved_at.endswith("Z")
    setup.book.grants["search"] = Grant("team", {"a": "r0"})  # the grant moved on
    assert _error(lambda: setup.service.get_passage("docs", "a-1", ctx())).code is (
        ErrorCode.SOURCE_UNAVAILABLE
    )
    setup.book.grants["search"] = None  # revoked
    assert _error(lambda: setup.service.get_passage("docs", "a-1", ctx())).code is (
        ErrorCode.PERMISSION_DENIED
    )


def test_an_unknown_corpus_is_denied_like_a_denied_one(setup: Setup) -> None:
    setup.book.grants["search"] = None
    for corpus in ("docs", "nope"):
        error = _error(lambda: setup.service.list_sources(corpus, ctx()))  # noqa: B023
        assert error.code is ErrorCode.PERMISSION_DENIED


# --- a passage cursor belongs to one write (probe A, session 39) ---------------------------


def _write(service: RetrievalService, tag: str, rev: str, n: int = 4) -> None:
    """Source `a` at `rev` with `n` passages whose ids and text say which write they are of."""
    chunks = [
        ChunkInput(f"a-{tag}-{i}", f"Write {tag}, passage {i}.", Location(start_line=i + 1))
        for i in range(n)
    ]
    service.index_context(IndexRequest("docs", SourceInfo("a", rev), chunks), ctx())


def _ids(detail: SourceDetail) -> list[str]:
    return [p.chunk_id for p in detail.passages]


def _revision_changed(work: object) -> None:
    error = _error(work)
    assert (error.code, error.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        SourceConflictReason.REVISION_CHANGED,
    )


def test_a_passage_cursor_belongs_to_its_write_not_to_its_label(setup: Setup) -> None:
    # A walk checked by label only went on over the passages of r1 written again (r1 -> r2 ->
    # r1, as the README allows) and of r1 deleted and indexed again: one listing, two writes.
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    setup.book.grants["delete"] = Grant("team", {"a": "r1"})
    service = setup.service
    _write(service, "A", "r1")
    first = service.get_source("docs", "a", ctx(), limit=2)
    assert _ids(first) == ["a-A-0", "a-A-1"]
    cursor = first.next_cursor
    rest = service.get_source("docs", "a", ctx(), limit=2, cursor=cursor)
    assert _ids(rest) == ["a-A-2", "a-A-3"]  # the same write goes on

    _write(service, "X", "r2", 1)
    _write(service, "B", "r1")
    _revision_changed(lambda: service.get_source("docs", "a", ctx(), limit=2, cursor=cursor))
    again = service.get_source("docs", "a", ctx(), limit=2)
    assert _ids(again) == ["a-B-0", "a-B-1"]

    service.delete_context(DeleteRequest("docs", "a", "r1"), ctx())
    _write(service, "C", "r1")
    _revision_changed(
        lambda: service.get_source("docs", "a", ctx(), limit=2, cursor=again.next_cursor)
    )
    assert _ids(service.get_source("docs", "a", ctx(), limit=2)) == ["a-C-0", "a-C-1"]


def test_a_passage_cursor_names_content_and_counts_no_other_write(setup: Setup) -> None:
    # It carried the store's version of the write, a counter every write of the corpus bumps:
    # comparing the cursors of two writes of a source told a reader how many writes (of any
    # source, any namespace) came between (probe L, session 40).
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    service = setup.service
    _write(service, "A", "r1")
    cursor = service.get_source("docs", "a", ctx(), limit=2).next_cursor
    for i in range(3):
        _index(setup, "b", f"r{i}", [f"Another source, write {i}."])
    _write(service, "X", "r2", 1)
    _write(service, "A", "r1")  # the same passages under the label again
    assert service.get_source("docs", "a", ctx(), limit=2).next_cursor == cursor
    # ...so the walk goes on over them rightly.
    rest = service.get_source("docs", "a", ctx(), limit=2, cursor=cursor)
    assert _ids(rest) == ["a-A-2", "a-A-3"]


def test_a_passage_cursor_of_the_earlier_format_restarts_the_walk(setup: Setup) -> None:
    # It names no write, so nothing shows its walk is this write's: the answer a replaced
    # source gets, whose remedy (list again without a cursor) is the right one, not a 400
    # that tells a client it sent what no listing returned (it did, before an upgrade).
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    _write(setup.service, "A", "r1")
    earlier = earlier_passages_cursor("docs", 1, "a", "r1")
    _revision_changed(lambda: setup.service.get_source("docs", "a", ctx(), cursor=earlier))


class WritesBeforePassages:
    """The store, except that `writes` commit right before its next passage read: between the
    two reads of a page (the source, then its passages). A write that adds writes leaves them
    for the passage read after."""

    def __init__(self, store: VectorStore, writes: list[Callable[[], None]]) -> None:
        self.store = store
        self.writes = writes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def list_passages(self, *args: Any, **kwargs: Any) -> list[PassageSummary]:
        pending, self.writes[:] = list(self.writes), []
        for write in pending:
            write()
        return self.store.list_passages(*args, **kwargs)


def test_a_page_never_shows_passages_of_a_write_that_came_between_its_reads(
    setup: Setup,
) -> None:
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    writer = setup.service
    docs = writer.corpus("docs")
    _write(writer, "A", "r1", 3)
    writes: list[Callable[[], None]] = []
    racing = WritesBeforePassages(docs.store, writes)
    reader = RetrievalService([dataclasses.replace(docs, store=cast(VectorStore, racing))])
    label_back = [lambda: _write(writer, "X", "r2", 1), lambda: _write(writer, "B", "r1")]

    writes += label_back
    detail = reader.get_source("docs", "a", ctx(), limit=10)
    # Read again, whole: not A's source (3 passages) with B's passages.
    assert (detail.source.chunk_count, _ids(detail)) == (4, [f"a-B-{i}" for i in range(4)])

    cursor = reader.get_source("docs", "a", ctx(), limit=2).next_cursor
    writes += [lambda: _write(writer, "X", "r2", 1), lambda: _write(writer, "C", "r1")]
    _revision_changed(lambda: reader.get_source("docs", "a", ctx(), limit=2, cursor=cursor))

    # The same race twice in a row: read a third time, not a 404 for a source that was there
    # all along (review V, session 39: the second marker equalled the first).
    again = [lambda: _write(writer, "X", "r2", 1), lambda: _write(writer, "E", "r1")]
    writes += [
        lambda: _write(writer, "X", "r2", 1),
        lambda: _write(writer, "D", "r1"),
        lambda: writes.extend(again),
    ]
    detail = reader.get_source("docs", "a", ctx(), limit=10)
    assert _ids(detail) == [f"a-E-{i}" for i in range(4)]

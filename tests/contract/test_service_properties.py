"""Property, through RetrievalService with the real local model: random grants never leak.

A fixed corpus (two namespaces, current and superseded revisions) is indexed once through the
service; every example then draws a grant and a request. Search must return only passages of
the granted namespace at exactly the granted revisions, as many as the limit allows, and treat
an explicit id that is not granted or not current exactly like a missing one: in each search
mode (dense, lexical, hybrid), whose grant path is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms, term_frequencies
from retrieval_host.core.models import (
    ChunkInput,
    IndexRequest,
    SearchMode,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import STORE_KINDS, _open_store
from tests.contract.test_service_with_store import GrantBook

NAMESPACES = ("team-a", "team-b")
SOURCES = ("s0", "s1", "s2", "s3", "s4")
TOPICS = ("otters", "invoices", "volcanoes", "chess", "bread", "satellites")
QUERIES = ("otters in rivers", "unpaid invoice", "lava", "an opening move", "baking", "orbit")


@dataclass
class Indexed:
    service: RetrievalService
    book: GrantBook
    current: dict[tuple[str, str], tuple[str, int]]  # (namespace, source) -> (revision, chunks)


def _texts(namespace: str, source_id: str, rev: str, count: int) -> list[str]:
    topic = TOPICS[(NAMESPACES.index(namespace) + SOURCES.index(source_id) + int(rev[1:])) % 6]
    return [
        f"A note on {topic}, part {i} of {source_id} in {namespace} ({rev})." for i in range(count)
    ]


@pytest.fixture(scope="module", params=STORE_KINDS)
def indexed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    local_embedding: LocalEmbedding,
) -> Iterator[Indexed]:
    store = _open_store(str(request.param), tmp_path_factory.mktemp("svc-props"), 4)
    book = GrantBook()
    service = RetrievalService([Corpus("docs", "passages-v1", local_embedding, store, book)])
    context = RequestContext(subject="indexer")
    current: dict[tuple[str, str], tuple[str, int]] = {}
    for n, namespace in enumerate(NAMESPACES):
        book.grants["index"] = Grant(namespace, dict.fromkeys(SOURCES, ANY_REVISION))
        for s, source_id in enumerate(SOURCES):
            # Some sources move on to r2, so r1 is a superseded revision a grant can name.
            revisions = ["r1", "r2"] if (n + s) % 2 == 0 else ["r1"]
            for rev in revisions:
                count = 1 + (n + s + len(rev)) % 3
                chunks = [
                    ChunkInput(f"{source_id}.{rev}.{i}", text)
                    for i, text in enumerate(_texts(namespace, source_id, rev, count))
                ]
                service.index_context(
                    IndexRequest("docs", SourceInfo(source_id, rev), chunks), context
                )
                current[(namespace, source_id)] = (rev, count)
    yield Indexed(service, book, current)
    store.close()


grant_revisions = st.sampled_from(["current", "superseded", "never-written", ANY_REVISION])


@settings(max_examples=200, deadline=None)
@given(
    namespace=st.sampled_from((*NAMESPACES, "team-c")),
    granted=st.dictionaries(st.sampled_from((*SOURCES, "ghost")), grant_revisions, max_size=6),
    explicit=st.none() | st.lists(st.sampled_from((*SOURCES, "ghost")), min_size=1, max_size=3),
    query=st.sampled_from(QUERIES),
    limit=st.integers(1, 10),
    mode=st.sampled_from(["dense", "lexical", "hybrid"]),
)
def test_search_returns_only_granted_namespace_sources_and_revisions(
    indexed: Indexed,
    namespace: str,
    granted: dict[str, str],
    explicit: list[str] | None,
    query: str,
    limit: int,
    mode: SearchMode,
) -> None:
    def resolve(source_id: str, choice: str) -> str:
        rev = indexed.current.get((namespace, source_id), ("r1", 0))[0]
        return {
            "current": rev,
            "superseded": "r1" if rev == "r2" else "r0",
            "never-written": "r7",
        }.get(choice, choice)

    sources = {sid: resolve(sid, choice) for sid, choice in granted.items()}
    indexed.book.grants["search"] = Grant(namespace, sources)
    exact = {sid: rev for sid, rev in sources.items() if rev != ANY_REVISION}

    def is_current(sid: str) -> bool:
        stored = indexed.current.get((namespace, sid))
        return stored is not None and stored[0] == exact.get(sid)

    request = SearchRequest("docs", query, source_ids=explicit, limit=limit, mode=mode)
    context = RequestContext(subject="reader")
    if explicit is not None and not all(is_current(sid) for sid in explicit):
        with pytest.raises(RetrievalError) as excinfo:
            indexed.service.search_context(request, context)
        assert excinfo.value.code is ErrorCode.SOURCE_UNAVAILABLE
        assert str(excinfo.value) == str(source_unavailable())
        return

    result = indexed.service.search_context(request, context)

    wanted = set(explicit) if explicit is not None else set(exact)
    for hit in result.hits:
        assert hit.scope.namespace == namespace
        assert hit.source.id in wanted
        assert exact[hit.source.id] == hit.source.revision
        assert hit.text in _texts(namespace, hit.source.id, hit.source.revision, 3)
    passages = [
        text
        for sid in wanted
        if is_current(sid)
        for text in _texts(namespace, sid, *indexed.current[(namespace, sid)])
    ]
    if mode == "lexical":  # only passages sharing a term with the query are ranked
        terms = set(query_terms(query, DEFAULT_ANALYZER))
        passages = [p for p in passages if terms & set(term_frequencies(p, DEFAULT_ANALYZER))]
        assert all(terms & set(term_frequencies(hit.text, DEFAULT_ANALYZER)) for hit in result.hits)
        assert all(set(hit.scores) == {"lexical"} for hit in result.hits)
    if mode == "dense":
        assert all(set(hit.scores) == {"dense"} for hit in result.hits)
    if mode == "hybrid":  # every fused hit scored in both modes (`core.fusion`)
        assert all(set(hit.scores) == {"dense", "lexical"} for hit in result.hits)
    available = len(passages)
    assert len(result.hits) == min(limit, available)
    assert result.truncated == (available > limit)


@settings(max_examples=100, deadline=None)
@given(
    namespace=st.sampled_from((*NAMESPACES, "team-c")),
    granted=st.dictionaries(st.sampled_from((*SOURCES, "ghost")), grant_revisions, max_size=6),
    limit=st.integers(1, 4),
)
def test_listing_shows_exactly_the_granted_current_sources(
    indexed: Indexed, namespace: str, granted: dict[str, str], limit: int
) -> None:
    def resolve(source_id: str, choice: str) -> str:
        rev = indexed.current.get((namespace, source_id), ("r1", 0))[0]
        return {
            "current": rev,
            "superseded": "r1" if rev == "r2" else "r0",
            "never-written": "r7",
        }.get(choice, choice)

    sources = {sid: resolve(sid, choice) for sid, choice in granted.items()}
    indexed.book.grants["search"] = Grant(namespace, sources)
    expected = sorted(
        (sid, rev)
        for sid, rev in sources.items()
        if indexed.current.get((namespace, sid), ("", 0))[0] == rev
    )
    context = RequestContext(subject="reader")
    listed: list[tuple[str, str]] = []
    cursor: str | None = None
    while True:
        page = indexed.service.list_sources("docs", context, limit=limit, cursor=cursor)
        assert len(page.sources) <= limit
        listed += [(s.id, s.revision) for s in page.sources]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert listed == expected  # none more, none less, in order, each once
    [corpus] = indexed.service.list_corpora(context)
    assert corpus.sources == len(expected)
    assert corpus.passages == sum(indexed.current[(namespace, sid)][1] for sid, _ in expected)
    for sid in (*SOURCES, "ghost"):
        if (sid, sources.get(sid)) in expected:
            detail = indexed.service.get_source("docs", sid, context)
            assert len(detail.passages) == indexed.current[(namespace, sid)][1]
        else:
            with pytest.raises(RetrievalError) as excinfo:
                indexed.service.get_source("docs", sid, context)
            assert str(excinfo.value) == str(source_unavailable())

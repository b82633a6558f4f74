"""What an in-process caller can pass that the wire cannot: typed refusals, never a raw error.

A black-box test of the library found `str`s holding a lone surrogate (a file name that is not
UTF-8, decoded with `surrogateescape`) failing inside hashes, stores and the tokenizer with
their own `UnicodeEncodeError` / `TypeError`; a bare string given as `source_ids` searched its
letters; an authorizer's `Grant` holding a list failed later with an `AttributeError`; and a
negative ingest deadline answered `DOCUMENT_TOO_COMPLEX`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import AuthorizationRequest, Grant
from retrieval_host.core.runs.request import check_run_request
from retrieval_host.core.runs_model import RunRequest, RunRetrieval
from retrieval_host.core.service import RetrievalService
from retrieval_host.driver import IngestRequest
from tests.support.ingest_driver import CORPUS, NAMESPACE, Host, context, make_host

LONE = "\ud800"


@pytest.fixture
def host(tmp_path: Path, local_embedding: LocalEmbedding) -> Iterator[Host]:
    h = make_host(tmp_path / "store" / "index.db", local_embedding)
    h.library.readable = {"guide": "r1"}
    h.driver.retrieval.index_context(
        _index("guide", "r1", "Boats moor on the east quay."), context()
    )
    yield h
    h.store.close()


def _index(
    source_id: str,
    revision: str,
    text: str,
    *,
    title: str = "Guide",
    metadata: dict[str, Any] | None = None,
    chunk_id: str = "guide-0",
    section: tuple[str, ...] = (),
) -> IndexRequest:
    return IndexRequest(
        CORPUS,
        SourceInfo(source_id, revision, title=title, metadata=metadata or {}),
        [ChunkInput(chunk_id, text, Location(start_line=1), section_path=section)],
    )


def _refused(work: Callable[[], object]) -> RetrievalError:
    with pytest.raises(RetrievalError) as caught:
        work()
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    return caught.value


def test_a_lone_surrogate_anywhere_is_a_typed_refusal_that_writes_nothing(host: Host) -> None:
    service = host.driver.retrieval
    calls: dict[str, Callable[[], object]] = {
        "query": lambda: service.search_context(SearchRequest(CORPUS, f"quay {LONE}"), context()),
        "passage text": lambda: service.index_context(_index("g2", "r1", f"A {LONE}"), context()),
        "title": lambda: service.index_context(
            _index("g2", "r1", "Text.", title=f"T{LONE}"), context()
        ),
        "source id": lambda: service.index_context(_index(f"g{LONE}", "r1", "Text."), context()),
        "metadata": lambda: service.index_context(
            _index("g2", "r1", "Text.", metadata={f"k{LONE}": 1}), context()
        ),
        "section heading": lambda: service.index_context(
            _index("g2", "r1", "Text.", section=(f"H{LONE}",)), context()
        ),
        "chunk id": lambda: service.get_passage(CORPUS, f"guide-{LONE}", context()),
        "ingested source id": lambda: host.driver.ingest_context(
            IngestRequest(CORPUS, f"g{LONE}", "text/plain", b"Text."), context()
        ),
    }
    for name, work in calls.items():
        error = _refused(work)
        assert "valid Unicode" in error.detail or "surrogate" in error.detail, (name, error)
    assert host.store.current_revisions(CORPUS, NAMESPACE) == {"guide": "r1"}
    hits = service.search_context(SearchRequest(CORPUS, "quay"), context()).hits
    assert [h.source.id for h in hits] == ["guide"]


def test_one_string_given_as_source_ids_is_refused_not_split_into_letters(host: Host) -> None:
    request = SearchRequest(CORPUS, "quay", source_ids="guide")
    error = _refused(lambda: host.driver.retrieval.search_context(request, context()))
    assert "list of ids" in error.detail
    run = RunRequest(
        "extractive", "extractive", "Where?", retrieval=RunRetrieval(CORPUS, source_ids="guide")
    )
    assert "list of ids" in _refused(lambda: check_run_request(run)).detail
    # Nor bytes, ids that are not text, or a limit that is not a whole number (raw TypeErrors
    # from deep inside the search, a second black-box test).
    odd: list[Any] = [
        SearchRequest(CORPUS, "quay", source_ids=cast(Any, b"guide")),
        SearchRequest(CORPUS, "quay", source_ids=cast(Any, [b"guide"])),
        SearchRequest(CORPUS, "quay", source_ids=cast(Any, [7])),
        SearchRequest(CORPUS, "quay", limit=cast(Any, 2.5)),
        # A third black-box test's: wrongly typed neighbours of those fields.
        SearchRequest(CORPUS, cast(Any, b"quay")),
        SearchRequest(CORPUS, "quay", min_score=cast(Any, "0.5")),
        SearchRequest(CORPUS, "quay", max_age_s=cast(Any, "5")),
        SearchRequest(CORPUS, "quay", max_context_bytes=cast(Any, "5")),
        SearchRequest(CORPUS, "quay", mode=cast(Any, ["dense"])),
        SearchRequest(CORPUS, "quay", source_ids=cast(Any, 7)),
    ]
    for request in odd:
        _refused(partial(host.driver.retrieval.search_context, request, context()))
    listed = SearchRequest(CORPUS, "quay", source_ids=["guide"])
    assert [h.source.id for h in host.driver.retrieval.search_context(listed, context()).hits]


def test_query_and_run_input_lengths_are_the_wires(host: Host) -> None:
    # A black-box test: in-process took run inputs of 65,536 bytes where the wire refuses past
    # 16,384 characters. Queries: 8 KiB of UTF-8 on both (the wire took 2,048 characters).
    service = host.driver.retrieval
    service.search_context(SearchRequest(CORPUS, "quay " + "q" * 8_187), context())
    error = _refused(
        lambda: service.search_context(SearchRequest(CORPUS, "quay " + "q" * 8_188), context())
    )
    assert "8192 bytes" in error.detail
    emoji = _refused(lambda: service.search_context(SearchRequest(CORPUS, "🚢" * 2_049), context()))
    assert "8192 bytes" in emoji.detail
    check_run_request(RunRequest("extractive", "extractive", "w" * 16_384))
    error = _refused(
        lambda: check_run_request(RunRequest("extractive", "extractive", "w" * 16_385))
    )
    assert "16384 characters" in error.detail
    surrogate = _refused(lambda: check_run_request(RunRequest("extractive", "extractive", LONE)))
    assert "Unicode" in surrogate.detail or "surrogate" in surrogate.detail


@pytest.mark.parametrize("deadline", [0.0, -1.0, float("nan")])
def test_an_ingest_deadline_must_be_a_positive_number(host: Host, deadline: float) -> None:
    request = IngestRequest(CORPUS, "notes", "text/plain", b"Some notes.")
    error = _refused(lambda: host.driver.ingest_context(request, context(), deadline_s=deadline))
    assert "deadline_s" in error.detail
    data: Any = "Some notes."  # a str where the file's bytes belong
    wrong = IngestRequest(CORPUS, "notes", "text/plain", data)
    assert "bytes" in _refused(lambda: host.driver.ingest_context(wrong, context())).detail


def test_a_grant_that_is_not_a_mapping_is_the_authorizers_type_error(host: Host) -> None:
    listed: Any = ["guide"]

    def sloppy(request: AuthorizationRequest, ctx: object) -> Grant:
        return Grant(NAMESPACE, listed)

    service = RetrievalService([dataclasses.replace(host.corpus, authorize=sloppy)])
    with pytest.raises(TypeError, match="map source ids to revisions: got list"):
        service.search_context(SearchRequest(CORPUS, "quay"), context())


def test_passages_that_are_not_chunk_inputs_of_text_are_typed_refusals(host: Host) -> None:
    service = host.driver.retrieval
    source = SourceInfo("g2", "r1", title="Guide")
    wrong: list[IndexRequest] = [
        IndexRequest(CORPUS, source, cast(Any, "abc")),
        IndexRequest(CORPUS, source, [ChunkInput("g2-0", cast(Any, b"bytes"))]),
        IndexRequest(CORPUS, source, [ChunkInput("g2-0", "Text.", Location(page=cast(Any, "1")))]),
        IndexRequest(
            CORPUS, SourceInfo("g2", "r1", title=cast(Any, b"T")), [ChunkInput("g2-0", "T.")]
        ),
    ]
    for request in wrong:
        _refused(partial(service.index_context, request, context()))
    assert host.store.current_revisions(CORPUS, NAMESPACE) == {"guide": "r1"}

"""`RetrievalService.get_passage` over every store: a passage the caller may not read takes the
path of a missing one up to the grant, so its timing does not tell that it exists."""

from __future__ import annotations

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import ANY_REVISION, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_with_store import GrantBook, Setup, ctx, index_request
from tests.contract.test_store_inspection import decoded_metadata


@pytest.fixture
def setup(harness: StoreHarness, local_embedding: LocalEmbedding) -> Setup:
    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION, "b": ANY_REVISION})
    corpus = Corpus("docs", "passages-v1", local_embedding, harness.open(), book)
    return Setup(RetrievalService([corpus]), book, harness.kind)


def _unavailable(setup: Setup, chunk_id: str, revision: str | None = None) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        setup.service.get_passage("docs", chunk_id, ctx(), revision=revision)
    assert excinfo.value.code is ErrorCode.SOURCE_UNAVAILABLE


def test_get_passage_decodes_nothing_of_a_passage_the_grant_refuses(
    setup: Setup, harness: StoreHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A black-box probe timed `GET .../passages/ops-plan-2` of a hidden source 0.6-0.9 ms
    # slower than a missing chunk id: the store read and decoded the hidden source's ~16 KB
    # of metadata before the service checked the grant.
    setup.service.index_context(index_request("a", "r1", ["Otters."]), ctx())
    setup.service.index_context(index_request("b", "r1", ["Hidden plan."]), ctx())
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    decoded = decoded_metadata(harness, monkeypatch)

    _unavailable(setup, "b-0")  # another source's
    _unavailable(setup, "a-0", revision="r0")  # a citation of another revision
    _unavailable(setup, "nowhere")
    assert decoded == []
    passage = setup.service.get_passage("docs", "a-0", ctx(), revision="r1")
    assert (passage.text, passage.source.revision, len(decoded)) == ("Otters.", "r1", 1)

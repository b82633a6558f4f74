"""A passage cursor of the earlier release (five fields, no content) over every store: the
answer says what happened (probe A, session 42: one at the revision still current was told
"the source changed revision", which it had not)."""

from __future__ import annotations

import hashlib
import json

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, Grant
from retrieval_host.core.reasons import SourceConflictReason
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_with_store import GrantBook, Setup, ctx


@pytest.fixture
def setup(harness: StoreHarness, local_embedding: LocalEmbedding) -> Setup:
    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION})
    corpus = Corpus("docs", "passages-v1", local_embedding, harness.open(), book)
    return Setup(RetrievalService([corpus]), book, harness.kind)


def earlier_release_cursor(corpus: str, after: int, source: str, revision: str) -> str:
    """A passage cursor byte for byte as the earlier release wrote it (`encode_cursor` of
    commit 958ca19): five fields of compact JSON and the same 10-byte check."""
    body = ["passages", corpus, after, source, revision]
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    check = hashlib.sha256(b"retrieval-host/cursor/v1\x00" + payload).digest()[:10]
    return (payload + check).hex()


def _write(setup: Setup, revision: str) -> None:
    chunks = [
        ChunkInput(f"a-{revision}-{i}", f"Write {revision}, passage {i}.", Location(i + 1))
        for i in range(4)
    ]
    setup.service.index_context(IndexRequest("docs", SourceInfo("a", revision), chunks), ctx())


def _conflict(setup: Setup, cursor: str) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        setup.service.get_source("docs", "a", ctx(), limit=2, cursor=cursor)
    error = excinfo.value
    # The code and reason of a replaced source: a client restarts the listing for either.
    assert (error.code, error.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        SourceConflictReason.REVISION_CHANGED,
    )
    return error


def test_an_earlier_release_cursor_at_the_current_revision_says_it_is_from_an_earlier_release(
    setup: Setup,
) -> None:
    # It names the label only, which r1 -> r2 -> r1 brings back with other passages: nothing
    # shows its walk is this write's, so it is not continued, but nothing changed either.
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    _write(setup, "r1")
    error = _conflict(setup, earlier_release_cursor("docs", 1, "a", "r1"))
    assert "earlier release" in str(error)
    assert "changed revision" not in str(error)
    assert "without a cursor" in str(error)
    # ...and the remedy it names works.
    again = setup.service.get_source("docs", "a", ctx(), limit=2)
    assert [p.chunk_id for p in again.passages] == ["a-r1-0", "a-r1-1"]


def test_an_earlier_release_cursor_of_a_replaced_revision_says_the_source_changed(
    setup: Setup,
) -> None:
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    _write(setup, "r1")
    cursor = earlier_release_cursor("docs", 1, "a", "r1")
    _write(setup, "r2")
    setup.book.grants["search"] = Grant("team", {"a": "r2"})
    error = _conflict(setup, cursor)
    assert "changed revision" in str(error)
    assert "earlier release" not in str(error)


def test_a_cursor_of_this_release_whose_label_came_back_with_other_passages_says_it_changed(
    setup: Setup,
) -> None:
    # Same label, other write: not taken for a cursor of the earlier release.
    setup.book.grants["search"] = Grant("team", {"a": "r1"})
    _write(setup, "r1")
    cursor = setup.service.get_source("docs", "a", ctx(), limit=2).next_cursor
    assert cursor is not None
    _write(setup, "r2")
    chunks = [ChunkInput("a-other", "Other passages under r1.", Location(1))]
    setup.service.index_context(IndexRequest("docs", SourceInfo("a", "r1"), chunks), ctx())
    error = _conflict(setup, cursor)
    assert "changed revision" in str(error)
    assert "earlier release" not in str(error)

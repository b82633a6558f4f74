"""The answers of a delete over every store: a stale revision of a stored source is a conflict
its writer can act on, while a source not stored and one the caller may not delete answer
alike.

A black-box test (session 35) found every delete naming an old revision of a stored source
answered `SOURCE_UNAVAILABLE` on the quickstart host, exactly as for a source never stored: the
example application grants a delete at the store's current revision, and the service answered
404 whenever the grant's revision was not the request's, so a writer racing another could not
tell "replaced: fetch the revision and retry" from "deleted".
"""

from __future__ import annotations

import dataclasses

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import DeleteRequest
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.reasons import SourceConflictReason
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_with_store import GrantBook, Setup, ctx, index_request


@pytest.fixture
def setup(harness: StoreHarness, local_embedding: LocalEmbedding) -> Setup:
    book = GrantBook()
    book.grants["index"] = Grant("team", {"a": ANY_REVISION, "b": ANY_REVISION})
    corpus = Corpus("docs", "passages-v1", local_embedding, harness.open(), book)
    service = RetrievalService([corpus])
    service.index_context(index_request("a", "r1"), ctx())
    service.index_context(index_request("a", "r2", ["Only otters now."]), ctx())
    return Setup(service, book, harness.kind)


def _error(setup: Setup, source_id: str, revision: str) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        setup.service.delete_context(DeleteRequest("docs", source_id, revision), ctx())
    return excinfo.value


def _answer(error: RetrievalError) -> tuple[object, ...]:
    return (error.code, error.detail, error.reason, str(error), error.status, error.title)


def _stored(setup: Setup) -> dict[str, str]:
    return setup.service.corpus("docs").store.current_revisions("docs", "team", None)


def test_a_delete_naming_a_replaced_revision_is_a_stale_revision_conflict(setup: Setup) -> None:
    # Granted as the example application grants: the store's current revision.
    setup.book.grants["delete"] = Grant("team", {"a": "r2"})
    stale = _error(setup, "a", "r1")
    assert (stale.code, stale.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        SourceConflictReason.STALE_REVISION,
    )
    assert stale.status == 409
    assert _stored(setup) == {"a": "r2"}  # nothing deleted
    deleted = setup.service.delete_context(DeleteRequest("docs", "a", "r2"), ctx())
    assert deleted.deleted_chunks == 1


def test_a_stale_delete_answers_as_the_store_does_for_a_grant_it_overtook(setup: Setup) -> None:
    # Granted the revision the request names, while the store holds another: the store's
    # own answer. The two ways of being stale read the same.
    setup.book.grants["delete"] = Grant("team", {"a": "r1"})
    by_store = _error(setup, "a", "r1")
    setup.book.grants["delete"] = Grant("team", {"a": "r2"})
    by_grant = _error(setup, "a", "r1")
    assert _answer(by_grant) == _answer(by_store)


def test_a_source_not_stored_and_one_not_deletable_answer_alike(setup: Setup) -> None:
    setup.book.grants["delete"] = Grant("team", {"ghost": "r2"})
    not_stored = _error(setup, "ghost", "r1")  # granted at another revision, never stored
    never_granted = _error(setup, "never", "r1")
    setup.book.grants["delete"] = Grant("team", {"b": "r1"})
    not_deletable = _error(setup, "a", "r1")  # stored, not granted
    setup.book.grants["delete"] = Grant("team", {"a": ANY_REVISION})
    any_revision = _error(setup, "a", "r1")  # `*` grants no delete
    assert not_stored.code is ErrorCode.SOURCE_UNAVAILABLE
    assert (
        _answer(not_stored)
        == _answer(never_granted)
        == _answer(not_deletable)
        == _answer(any_revision)
    )
    assert _stored(setup) == {"a": "r2"}


def _revoking(setup: Setup, later: Grant | None) -> tuple[RetrievalService, list[str]]:
    """The service with an authorizer that grants delete of `a` at r2 once, then `later`."""
    asked: list[str] = []

    def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        asked.append(request.operation)
        return Grant("team", {"a": "r2"}) if len(asked) == 1 else later

    docs = setup.service.corpus("docs")
    return RetrievalService([dataclasses.replace(docs, authorize=authorize)]), asked


@pytest.mark.parametrize(
    ("later", "code"),
    [
        (Grant("team", {"b": "r1"}), ErrorCode.SOURCE_UNAVAILABLE),
        (Grant("other", {"a": "r2"}), ErrorCode.SOURCE_UNAVAILABLE),
        (None, ErrorCode.PERMISSION_DENIED),
    ],
)
def test_a_stale_delete_no_longer_granted_after_the_read_says_nothing_of_the_source(
    setup: Setup, later: Grant | None, code: ErrorCode
) -> None:
    service, asked = _revoking(setup, later)
    with pytest.raises(RetrievalError) as excinfo:
        service.delete_context(DeleteRequest("docs", "a", "r1"), ctx())
    assert excinfo.value.code is code
    assert asked == ["delete", "delete"]  # the grant, and the check after reading the store

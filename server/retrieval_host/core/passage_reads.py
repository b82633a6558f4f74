"""The read behind a saved citation (`RetrievalService.get_passage`), pure.

It authorizes as a search does, reads the passage at the granted revision of its source, and
asks the authorizer again after the read. A source replaced while the passage is read made a
passage that both revisions hold answer `SOURCE_UNAVAILABLE` (probe "consist", session 43: 116
of 2,793 reads of one chunk id on SQLite, 34 of 1,254 on PostgreSQL, under ~3 replaces a
second): the grant named the revision current when the authorizer answered, a writer committed
the next one, and the store held the chunk at a revision the grant did not name, or the answer
after the read named another. So, as a search and a source read do (`core.source_reads`), a
read whose grant a commit overtook is authorized and made again, whole: at most
`GRANT_ATTEMPTS` times, and not when the authorizer grants the same overtaken revision again.
A missing, deleted or revoked passage is not retried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import source_unavailable
from retrieval_host.core.grants import (
    ask_again,
    authorize,
    overtaken,
    searchable,
    searchable_again,
)
from retrieval_host.core.inspection import Passage
from retrieval_host.core.models import Scope, SourceRef
from retrieval_host.core.passage_metadata import passage_metadata

__all__ = ["read_passage"]


def read_passage(
    corpus: Corpus,
    chunk_id: str,
    revision: str | None,
    context: RequestContext,
    clock: Callable[[], str],
) -> Passage:
    """The passage with that chunk id, authorized now (module docstring); at its source's
    `revision` when given. `SOURCE_UNAVAILABLE` otherwise."""
    previous: Mapping[str, str] = {}
    attempt = 1
    while True:
        passage, stale = _read_once(corpus, chunk_id, revision, context, clock)
        if passage is not None:
            return passage
        if not ask_again(stale, previous, attempt):
            raise source_unavailable()
        previous, attempt = stale, attempt + 1


def _read_once(
    corpus: Corpus,
    chunk_id: str,
    revision: str | None,
    context: RequestContext,
    clock: Callable[[], str],
) -> tuple[Passage | None, dict[str, str]]:
    """One authorized read: the passage, or None and the granted revisions a commit overtook
    (source id -> revision granted; empty when the passage is missing or not granted)."""
    grant = authorize(corpus, "search", None, context)
    context.cancel.check()
    allowed = searchable(grant)
    held: dict[str, str] = {}  # the source and revision the store holds the chunk at

    def readable(source_id: str, rev: str) -> bool:
        held[source_id] = rev
        return allowed.get(source_id) == rev and revision in (None, rev)

    # The store checks the grant before it reads the text and metadata: a hidden passage
    # must cost what a missing one does, or its timing tells that it exists.
    stored = corpus.store.read_passage(corpus.id, grant.namespace, chunk_id, readable)
    if stored is None:
        granted = {sid: allowed[sid] for sid in held if sid in allowed}
        return None, overtaken(granted, held)
    still = searchable_again(corpus, (stored.source_id,), grant, context) or {}
    if still.get(stored.source_id) != stored.revision:
        return None, overtaken({stored.source_id: stored.revision}, still)
    return Passage(
        stored.chunk_id,
        SourceRef(stored.source_id, stored.revision),
        stored.location,
        stored.text,
        stored.document_sha256,
        clock(),
        Scope(corpus.id, corpus.version, grant.namespace),
        passage_metadata(
            stored.metadata, stored.location, stored.text, media_type=stored.media_type
        ),
    ), {}

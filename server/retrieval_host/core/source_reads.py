"""The inspection reads of sources (`RetrievalService.list_sources`, `get_source`), pure.

Each authorizes as a search does, reads the store at the granted revisions, and asks the
authorizer again after the read: a source whose revision the second answer no longer grants is
left out (a listing) or unavailable (one source). A source replaced while it is read would so
disappear although it was readable all along, at one revision or the other ("never shows half
an update"): the authorizer granted the revision current when it answered, a writer committed
the next one, and the read at the granted revision found nothing, or found what the later
answer no longer names. So, as a search does (`core.search`), when the store or the answer after
the read holds a granted source at another revision (`core.grants.overtaken`), the read is
authorized and made again, whole: at most `GRANT_ATTEMPTS` times, and not when the authorizer
grants the same overtaken revisions again. A deleted or revoked source is not retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retrieval_host.core.context import RequestContext
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.grants import (
    ask_again,
    authorize,
    overtaken,
    searchable,
    searchable_again,
)
from retrieval_host.core.inspection import (
    Cursor,
    SourceDetail,
    SourceFilter,
    SourcePage,
    SourceSummary,
    cursor_content,
    decode_cursor,
    encode_cursor,
    source_page,
    sources_cursor,
)
from retrieval_host.core.reasons import SourceConflictReason

__all__ = ["read_source", "read_sources"]


def read_sources(
    corpus: Corpus,
    context: RequestContext,
    where: SourceFilter,
    cursor: str | None,
    limit: int,
) -> SourcePage:
    """One page of the sources the subject may search that `where` keeps (module docstring)."""
    previous: Mapping[str, str] = {}
    attempt = 1
    while True:
        page, stale = _sources_once(corpus, context, where, cursor, limit)
        if not ask_again(stale, previous, attempt):
            return page
        previous, attempt = stale, attempt + 1
        context.cancel.check()


def _sources_once(
    corpus: Corpus,
    context: RequestContext,
    where: SourceFilter,
    cursor: str | None,
    limit: int,
) -> tuple[SourcePage, dict[str, str]]:
    """A page as one read gives it, and the granted revisions a commit overtook in it."""
    grant = authorize(corpus, "search", None, context)
    after = str(decode_cursor(cursor, "sources", corpus.id).after) if cursor is not None else None
    context.cancel.check()
    allowed = searchable(grant)
    fetched: set[str] = set()

    def fetch(start: str | None, n: int) -> Sequence[SourceSummary]:
        rows = corpus.store.list_sources(corpus.id, grant.namespace, allowed, after=start, limit=n)
        fetched.update(row.id for row in rows)
        return rows

    page, resume = source_page(fetch, where, after, limit)
    still = searchable_again(corpus, None, grant, context) or {}
    # Granted sources of the range this page covers that the store no longer holds at the
    # granted revision, and listed ones the answer after the read grants at another.
    missing = [
        sid
        for sid in allowed
        if sid not in fetched
        and (after is None or sid > after)
        and (resume is None or sid <= resume)
    ]
    stored = corpus.store.current_revisions(corpus.id, grant.namespace, missing) if missing else {}
    stale = {
        **overtaken({sid: allowed[sid] for sid in missing}, stored),
        **overtaken({row.id: row.revision for row in page}, still),
    }
    visible = [row for row in page if still.get(row.id) == row.revision]
    return SourcePage(visible, sources_cursor(corpus.id, resume)), stale


def read_source(
    corpus: Corpus,
    source_id: str,
    context: RequestContext,
    cursor: str | None,
    limit: int,
) -> SourceDetail:
    """One source at its authorized revision with one page of its passages (module
    docstring). `SOURCE_UNAVAILABLE` for a source missing or not granted; `SOURCE_CONFLICT`
    (`revision-changed`) for a cursor of a write that is no longer the source's, even one
    under the same label, and for a cursor of the earlier format, which names no write (its
    detail says so when its label is still current)."""
    previous: Mapping[str, str] = {}
    attempt = 1
    while True:
        detail = _source_once(corpus, source_id, context, cursor, limit)
        if isinstance(detail, SourceDetail):
            return detail
        if not ask_again(detail, previous, attempt):
            raise source_unavailable()
        previous, attempt = detail, attempt + 1
        context.cancel.check()


def _source_once(
    corpus: Corpus, source_id: str, context: RequestContext, cursor: str | None, limit: int
) -> SourceDetail | dict[str, str]:
    """The source as one read gives it, or the granted revision a commit overtook (empty: the
    source is missing or no longer granted)."""
    grant = authorize(corpus, "search", (source_id,), context)
    revision = searchable(grant).get(source_id)
    if revision is None:
        raise source_unavailable()
    context.cancel.check()
    summary = _summary(corpus, grant.namespace, source_id, revision)
    if summary is None:
        # Missing looks exactly like unauthorized, unless a commit replaced the granted revision.
        stored = corpus.store.current_revisions(corpus.id, grant.namespace, (source_id,))
        return overtaken({source_id: revision}, stored)
    after: int | None = None
    if cursor is not None:
        position = decode_cursor(cursor, "passages", corpus.id, source_id)
        # The content, not only the label: r1 -> r2 -> r1 (or a delete and re-index at r1)
        # brings the label back with other passages. A cursor of the earlier format names no
        # content, so its walk cannot be shown to be this one's: it restarts as after a
        # replacement (unless the store keeps no fingerprints either).
        if (position.revision, position.content) != (summary.revision, cursor_content(summary)):
            earlier = position.content is None and position.revision == summary.revision
            raise _cursor_conflict(earlier=earlier)
        after = int(position.after)
    context.cancel.check()
    passages = corpus.store.list_passages(
        corpus.id, grant.namespace, source_id, summary.revision, after=after, limit=limit + 1
    )
    # The passages are read by label in a statement of their own: a write between the two
    # reads that left the same label would pass its passages off as this write's. Versions
    # never come back, so the same one read again after the passages proves none came between.
    again = _summary(corpus, grant.namespace, source_id, revision)
    if again is None:
        return {source_id: summary.revision}  # read again, whole (a cursor then meets 409)
    if again.version != summary.version:
        # The same label, written again: read again, whole. The marker names the write, so a
        # second such race is not taken for an authorizer stuck on one revision (`ask_again`):
        # it was answered 404 for a source that was there all along (review V, session 39).
        return {source_id: f"{summary.revision}\x00{again.version}"}
    still = searchable_again(corpus, (source_id,), grant, context) or {}
    if still.get(source_id) != summary.revision:
        return overtaken({source_id: summary.revision}, still)
    page, more = passages[:limit], len(passages) > limit
    next_cursor = (
        encode_cursor(
            Cursor(
                "passages",
                corpus.id,
                page[-1].ordinal,
                source_id,
                summary.revision,
                cursor_content(summary),
            )
        )
        if more and page
        else None
    )
    return SourceDetail(summary, page, next_cursor)


def _cursor_conflict(*, earlier: bool) -> RetrievalError:
    """`SOURCE_CONFLICT` (`revision-changed`) for a passage cursor that does not name the
    source's current write. `earlier`: a cursor of the earlier format (no content) whose
    label is still the current one, which was told that the source changed revision although
    it need not have (probe A, session 42). Its label alone cannot show the write is the one
    it walked (r1 -> r2 -> r1), so it still restarts, with words that say why. The code and
    reason stay those of a replacement: a client does the same, list the passages again."""
    detail = (
        "this cursor was returned by an earlier release of the host and does not say which "
        "write of the source it pages through; list the source's passages again without a "
        "cursor."
        if earlier
        else "the source changed revision since this cursor was returned; list its "
        "passages again without a cursor."
    )
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT, detail, reason=SourceConflictReason.REVISION_CHANGED
    )


def _summary(corpus: Corpus, namespace: str, source_id: str, revision: str) -> SourceSummary | None:
    """The source if the store holds it at `revision`, with the version of that write."""
    rows = corpus.store.list_sources(
        corpus.id, namespace, {source_id: revision}, after=None, limit=1
    )
    return rows[0] if rows and rows[0].id == source_id else None

"""What a subject may see of a corpus without searching it: corpora, sources, passages.

Values of the inspection operations (`RetrievalService.list_corpora`, `list_sources`,
`get_source`, `get_passage`), and the opaque cursors that page through sources and passages.
Everything here is filtered by the same search authorization as a search: only sources the
application's authorizer grants, at exactly the granted revision, exist for the caller.

Cursors. A cursor names a position (the last source id, or the last passage ordinal of one
source revision) and what it pages through (corpus, listing, source, revision), encoded as
hex of canonical JSON followed by a 10-byte SHA-256 check (hex: URL-safe, and core keeps
to a few stdlib modules). The check makes any
edited or truncated cursor a typed `INVALID_REQUEST` (reason `invalid-cursor`) rather than a
silently different page; it is not a secret: a cursor grants nothing, since every page is
authorized again when it is read. The format is public, so a forged cursor is checked like
input: a string in it that is not Unicode scalar text (a lone surrogate, which JSON escapes can
spell) is `invalid-cursor` too, not a 500 when a store encodes it (probe A, session 39).

A passage cursor also names the content it was read from (`SourceSummary.content`): a label
can come back with other passages (r1 -> r2 -> r1, a delete and re-index at r1), and a walk
checked by label only went on over the new passages (probe A, session 39). It names the
content, not the store's version of the write: that version is a counter every write of the
corpus bumps (SQLite's generation, PostgreSQL's row id), and a reader comparing two cursors
counted the writes of sources it may not see, other namespaces' too (probe L, session 40).
The content fingerprint is a digest of what the reader of those passages sees anyway, and a
write under the same label with the same fingerprint holds the same passages in the same
order, so a walk over it goes on rightly. A source cursor needs no such thing: it is a
position in source id order, which no write of a source moves. Cursors of the earlier format
(five fields, no content) still decode, with `content` None; a passage cursor of them cannot
be shown to walk the current write, so reading it is a 409 whose detail says it is from an
earlier release when its label is still current (`source_reads`; probe A, session 42: it said
the source had changed revision).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import fold
from retrieval_host.core.models import Location, Metadata, Scope, SourceRef
from retrieval_host.core.reasons import InvalidRequestReason

MAX_PAGE_LIMIT: Final = 1000
DEFAULT_PAGE_LIMIT: Final = 100
MAX_CURSOR_CHARS: Final = 8192
_CHECK_BYTES: Final = 10
_CURSOR_DOMAIN: Final = b"retrieval-host/cursor/v1\x00"
_CONTENT_CHARS: Final = 32


@dataclass(frozen=True, slots=True)
class CorpusSummary:
    """One corpus as the caller may search it: identity and counts over its visible sources.

    `bytes` is the UTF-8 size of the visible passages' text (what byte budgets count).
    """

    id: str
    version: str
    embedding: EmbeddingDescriptor
    sources: int
    passages: int
    bytes: int
    read_only: bool = False  # its store takes no index or delete (`STORE_READ_ONLY`)


@dataclass(frozen=True, slots=True)
class SourceSummary:
    """One visible source at its authorized revision. `media_type` and `indexed_at` are None
    when the store did not record them (sources indexed as prepared passages have no type).

    `version` is the store's token of the write the revision was read from, as
    `ports.ReadRevision.version`: every write of the source changes it, even one that brings
    the same label back, and it never comes back. Never shown (it counts the corpus's writes).
    `content` is the write's fingerprint (`core.fingerprint.revision_fingerprint`): equal
    exactly when the passages, their locations and the provenance are; a passage cursor
    carries it to tell a later write of other passages under the same label (module
    docstring). None: a store that keeps them not."""

    id: str
    revision: str
    title: str
    metadata: Metadata
    chunk_count: int
    bytes: int
    media_type: str | None = None
    indexed_at: str | None = None
    version: str | None = None
    content: str | None = None


@dataclass(frozen=True, slots=True)
class SourcePage:
    """One page of a source listing; `next_cursor` continues it (None after the last)."""

    sources: Sequence[SourceSummary]
    next_cursor: str | None


MAX_FILTER_CHARS: Final = 256
# A filtered listing reads at most this many sources per page before it answers (with fewer
# than `limit`, and a cursor that resumes after the last one read): bounded work per request.
MAX_FILTERED_SCAN: Final = 10_000
_FILTER_BATCH: Final = 256


@dataclass(frozen=True, slots=True)
class SourceFilter:
    """What a source listing keeps: `title`, a case-insensitive substring of the title;
    `media_type`, the stored media type exactly (sources indexed as prepared passages have
    none and never match). None keeps every source."""

    title: str | None = None
    media_type: str | None = None

    def __post_init__(self) -> None:
        for name, value in (("title", self.title), ("media type", self.media_type)):
            if value is not None and not 1 <= len(value) <= MAX_FILTER_CHARS:
                raise RetrievalError(
                    ErrorCode.INVALID_REQUEST,
                    f"the {name} filter must hold 1..{MAX_FILTER_CHARS} characters.",
                )

    @property
    def keeps_all(self) -> bool:
        return self.title is None and self.media_type is None

    def keeps(self, source: SourceSummary) -> bool:
        # Folded as the lexical analyzer folds (`core.lexical.fold`): case, compatibility
        # forms, accents and either Unicode spelling of a letter (a black-box tester's title
        # stored in NFD was not found by its NFC spelling).
        if self.title is not None and fold(self.title) not in fold(source.title):
            return False
        return self.media_type is None or (source.media_type or "") == self.media_type.lower()


def source_page(
    fetch: Callable[[str | None, int], Sequence[SourceSummary]],
    where: SourceFilter,
    after: str | None,
    limit: int,
) -> tuple[list[SourceSummary], str | None]:
    """One page of up to `limit` sources that `where` keeps, read in id order from `fetch`
    (`fetch(after, n)`: the next `n` sources after id `after`), and the source id a next page
    starts after (None after the last). A filtered page may come back short, or empty, with a
    cursor: it stopped after reading `MAX_FILTERED_SCAN` sources."""
    if where.keeps_all:
        rows = fetch(after, limit + 1)
        page = list(rows[:limit])
        return page, (page[-1].id if len(rows) > limit and page else None)
    kept: list[SourceSummary] = []
    position, read = after, 0
    while True:
        rows = fetch(position, _FILTER_BATCH)
        for row in rows:
            if where.keeps(row):
                if len(kept) == limit:
                    return kept, kept[-1].id
                kept.append(row)
            position, read = row.id, read + 1
        if len(rows) < _FILTER_BATCH:
            return kept, None
        if read >= MAX_FILTERED_SCAN:
            return kept, position


@dataclass(frozen=True, slots=True)
class PassageSummary:
    """A passage of a source listing: its id, position in the revision and size."""

    chunk_id: str
    ordinal: int
    location: Location
    bytes: int


@dataclass(frozen=True, slots=True)
class SourceDetail:
    """One source with one page of its passages; `next_cursor` continues the passages."""

    source: SourceSummary
    passages: Sequence[PassageSummary]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Passage:
    """One passage as a search hit shows it (without a score): the read behind a citation."""

    chunk_id: str
    source: SourceRef
    location: Location
    text: str
    document_sha256: str
    retrieved_at: str
    scope: Scope
    metadata: Metadata = field(default_factory=dict)  # the source revision's


@dataclass(frozen=True, slots=True)
class SourceTotals:
    """Counts over a set of visible sources: sources, passages and passage text bytes."""

    sources: int = 0
    passages: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class StoredPassage:
    """One stored passage with the source revision it belongs to (a store's answer)."""

    chunk_id: str
    source_id: str
    revision: str
    text: str
    location: Location
    document_sha256: str
    metadata: Metadata = field(default_factory=dict)  # the source revision's
    media_type: str | None = None  # the source revision's stored type, as `Candidate`'s


@dataclass(frozen=True, slots=True)
class Cursor:
    """A decoded position: after source id `after` (sources) or ordinal `after` (passages) of
    `revision` holding `content` (`cursor_content`; None in a passage cursor of the earlier
    format)."""

    kind: Literal["sources", "passages"]
    corpus: str
    after: str | int
    source_id: str | None = None
    revision: str | None = None
    content: str | None = None


def cursor_content(summary: SourceSummary) -> str | None:
    """What a passage cursor names of the write it walks: 128 bits of its fingerprint."""
    return None if summary.content is None else summary.content[:_CONTENT_CHARS]


def invalid_cursor() -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST,
        "the cursor is not one this listing returned; start again without a cursor.",
        reason=InvalidRequestReason.INVALID_CURSOR,
    )


def check_page_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_LIMIT:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"limit must be an integer in 1..{MAX_PAGE_LIMIT}.",
            reason=InvalidRequestReason.PAGE_LIMIT,
        )


def encode_cursor(cursor: Cursor) -> str:
    body = [cursor.kind, cursor.corpus, cursor.after, cursor.source_id, cursor.revision]
    # Without a write (every source cursor) in the earlier format, byte for byte: a replica of
    # the previous release, beside this one in a rolling update, still reads it (review V).
    if cursor.content is not None:
        body.append(cursor.content)
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    check = hashlib.sha256(_CURSOR_DOMAIN + payload).digest()[:_CHECK_BYTES]
    return (payload + check).hex()


def sources_cursor(corpus: str, after: str | None) -> str | None:
    """The cursor of a source listing that resumes after source id `after` (None: no more)."""
    return None if after is None else encode_cursor(Cursor("sources", corpus, after))


def decode_cursor(
    token: str,
    kind: Literal["sources", "passages"],
    corpus: str,
    source_id: str | None = None,
) -> Cursor:
    """The position a cursor names; `INVALID_REQUEST` (`invalid-cursor`) for one that was
    edited, truncated, or returned by another listing (another corpus, kind or source), or
    that holds a string no listing writes (not Unicode scalar text)."""
    if not token or len(token) > MAX_CURSOR_CHARS or not token.isascii():
        raise invalid_cursor()
    try:
        raw = bytes.fromhex(token)
    except ValueError:
        raise invalid_cursor() from None
    payload, check = raw[:-_CHECK_BYTES], raw[-_CHECK_BYTES:]
    if len(raw) <= _CHECK_BYTES or (
        hashlib.sha256(_CURSOR_DOMAIN + payload).digest()[:_CHECK_BYTES] != check
    ):
        raise invalid_cursor()
    try:
        body = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise invalid_cursor() from None
    # Five fields: a cursor of the earlier format, which named no write (module docstring).
    if not isinstance(body, list) or len(body) not in (5, 6):
        raise invalid_cursor()
    if not all(_scalar_text(value) for value in body if isinstance(value, str)):
        raise invalid_cursor()
    got_kind, got_corpus, after, got_source, revision, *rest = body
    content = rest[0] if rest else None
    if got_kind != kind or got_corpus != corpus or got_source != source_id:
        raise invalid_cursor()
    if kind == "sources" and (
        not isinstance(after, str) or revision is not None or content is not None
    ):
        raise invalid_cursor()
    if kind == "passages" and (
        isinstance(after, bool)
        or not isinstance(after, int)
        # A position the stores' 64-bit ordinals can hold: a larger one, which any client can
        # write (the format is public, only checksummed), was a 500 (probe A, session 37).
        or not 0 <= after < 2**63
        or not isinstance(revision, str)
        or not (content is None or isinstance(content, str))
    ):
        raise invalid_cursor()
    return Cursor(kind, corpus, after, source_id, revision, content)


def _scalar_text(value: str) -> bool:
    """Whether `value` holds no surrogate code point: JSON's `\\ud800` escape decodes to
    one, which a store then fails to encode (UTF-8 has no form for it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

"""The wire models of inspection (protocol v1): what a token's subject may see of its corpora
without searching, listed page by page. Part of `models` (re-exported there), kept apart as
their own concern; the rules of `models` hold (requests forbid unknown fields, responses allow
them, camelCase on the wire).
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BeforeValidator, Field, JsonValue, StringConstraints

from retrieval_host_client.models import (
    Location,
    Revision,
    Scope,
    SourceRef,
    _integral,
    _Request,
    _Response,
    known_values,
)

__all__ = [
    "MAX_PAGE_LIMIT",
    "CorporaResponse",
    "CorpusInfo",
    "EmbeddingLabels",
    "PageCursor",
    "PageLimit",
    "PageParams",
    "PassageListing",
    "PassageParams",
    "PassageResponse",
    "SourceListParams",
    "SourceListing",
    "SourceResponse",
    "SourcesResponse",
    "WriteOnlyCorpus",
]


# What a token's subject may see of its corpora without searching: only sources the
# application authorizes for search, at exactly the authorized revision.

MAX_PAGE_LIMIT = 1000
# A token's operations on a corpus in protocol v1 (`models.known_values`: a newer host may list
# others, which the client passes on).
Operation: TypeAlias = Literal["search", "index", "delete"]
WriteOperation: TypeAlias = Literal["index", "delete"]
# Cursors are opaque: hex, as the host returns them (a changed one is a 400 `invalid-cursor`).
PageCursor = Annotated[str, StringConstraints(min_length=1, max_length=8192, pattern="^[0-9a-f]+$")]
PageLimit = Annotated[int, Field(ge=1, le=MAX_PAGE_LIMIT), BeforeValidator(_integral)]


class PageParams(_Request):
    """The query parameters of a listing: `limit` (1-1000, default 100; 400 `page-limit`
    outside) and the `cursor` of the previous page's `nextCursor`."""

    limit: PageLimit | None = None
    cursor: PageCursor | None = None


class PassageParams(_Request):
    """The query parameters of `GET /v1/corpora/{corpus}/passages/{chunkId}`: `revision`, the
    revision the citation was made from (a manifest entry's or a hit's): a passage whose
    source is now at another revision is then `SOURCE_UNAVAILABLE`, even when the new
    revision reuses the chunk id."""

    revision: Revision | None = None


class SourceListParams(PageParams):
    """A source listing's query parameters: the page's, and filters: `title` (a
    case-insensitive substring of the title) and `mediaType` (exactly)."""

    title: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    media_type: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None


class EmbeddingLabels(_Response):
    """The non-secret labels of the embedding that made a corpus's vectors."""

    provider_id: str
    vendor: str
    model: str
    dimensions: int
    metric: str


class CorpusInfo(_Response):
    """One corpus the token may search. `operations` are the token's grants on it;
    `sources`, `passages` and `bytes` (UTF-8 passage text) count what its subject may search.
    `read_only`: its store is a snapshot or replica; index and delete answer `STORE_READ_ONLY`."""

    id: str
    version: str
    embedding: EmbeddingLabels
    operations: list[Annotated[Operation | str, known_values(Operation)]]
    sources: int
    passages: int
    bytes: int
    read_only: bool = False


class WriteOnlyCorpus(_Response):
    """A corpus the token may index into or delete from but not search: its id and those
    operations, nothing about what it holds."""

    id: str
    operations: list[Annotated[WriteOperation | str, known_values(WriteOperation)]]


class CorporaResponse(_Response):
    """`GET /v1/corpora`: the corpora the token's subject may search, by id; `write_only`,
    the corpora of this host the token may only index into or delete from."""

    corpora: list[CorpusInfo]
    write_only: list[WriteOnlyCorpus] = Field(default_factory=list)


class SourceListing(_Response):
    """One visible source at its authorized revision: the revision a delete names.
    `media_type` is null for prepared passages, `indexed_at` (the revision's commit time,
    RFC 3339 UTC) for sources indexed before hosts recorded it."""

    id: str
    revision: str
    title: str
    media_type: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    chunk_count: int
    bytes: int
    indexed_at: str | None = None


class SourcesResponse(_Response):
    """One page of sources by id; `nextCursor` fetches the next (null after the last)."""

    sources: list[SourceListing]
    next_cursor: str | None = None


class PassageListing(_Response):
    """A passage of a source: its chunk id (for `GET .../passages/{chunkId}`), location, size."""

    chunk_id: str
    location: Location
    bytes: int


class SourceResponse(_Response):
    """One source with a page of its passages by position; `nextCursor` continues them."""

    source: SourceListing
    passages: list[PassageListing]
    next_cursor: str | None = None


class PassageResponse(_Response):
    """One passage as a search hit shows it (without a score), authorized at read."""

    chunk_id: str
    source: SourceRef
    location: Location
    text: str
    document_sha256: str
    retrieved_at: str
    scope: Scope
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

"""The JSON wire models of protocol v1: one schema for the client, the host and its OpenAPI.

Request models forbid unknown fields (a typo is an error, not a silently ignored option);
response models allow them, so an older client keeps working when the host adds a field.
Fields are snake_case in Python and camelCase on the wire.

The constraints here mirror the host's own checks wherever JSON Schema can say them, so a
request that matches the schema is not rejected for its shape (limits that depend on the
corpus, such as passage bytes, are reported by the host as typed problems).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Json,
    JsonValue,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "ChunkInput",
    "CorporaResponse",
    "CorpusInfo",
    "DeleteRequest",
    "DeleteResponse",
    "EmbeddingLabels",
    "EmbeddingUsage",
    "Health",
    "Hit",
    "HitScores",
    "IndexRequest",
    "IndexResponse",
    "IngestCompletedEvent",
    "IngestEvent",
    "IngestFailedEvent",
    "IngestParams",
    "IngestProgressEvent",
    "IngestStartedEvent",
    "Location",
    "LocationInput",
    "PageParams",
    "PassageListing",
    "PassageParams",
    "PassageResponse",
    "Problem",
    "ProtocolAuth",
    "ProtocolInfo",
    "ProtocolLimits",
    "Readiness",
    "RerankUsage",
    "Scope",
    "SearchRequest",
    "SearchResponse",
    "SearchUsage",
    "SourceInput",
    "SourceListing",
    "SourceRef",
    "SourceResponse",
    "SourcesResponse",
    "Usage",
    "WriteOnlyCorpus",
]

# Whitespace spelled out, exactly Python's `str.isspace()` set above U+001F: `\s` means
# different sets in Python, Rust (pydantic-core) and ECMAScript regexes, so a schema using it
# admits strings the host refuses (a fuzzer found U+0085). Every pattern here means the same in
# the three engines, so the schema, the host and a fuzzer's generator agree.
_SPACE = "\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# Control characters: Unicode category Cc, i.e. C0 (U+0000-U+001F), DEL and C1 (U+007F-U+009F).
_CONTROL = "\\x00-\\x1f\\x7f-\\x9f"
_EDGE = f"[^{_CONTROL}{_SPACE}]"  # neither control nor whitespace: what an id starts and ends with
# The identifier rule (corpus, source id, revision, chunk id, filter key), also core's
# `check_id`: 1-256 characters, no control character, no surrounding whitespace, and not `*`
# alone, the wildcard of grants (a source named `*` could never be granted on its own).
IDENTIFIER_PATTERN = (
    f"^(?:[^{_CONTROL}*{_SPACE}](?:[^{_CONTROL}]*{_EDGE})?|\\*[^{_CONTROL}]*{_EDGE})$"
)
Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=256, pattern=IDENTIFIER_PATTERN)
]
# A chunk id is also the handle a model cites as `[source:ID]`, which ends at whitespace or a
# bracket: the identifier rule without whitespace, `[` or `]` (core's `check_chunk_id`).
CHUNK_ID_PATTERN = (
    f"^(?:[^{_CONTROL}{_SPACE}*\\[\\]][^{_CONTROL}{_SPACE}\\[\\]]*"
    f"|\\*[^{_CONTROL}{_SPACE}\\[\\]]+)$"
)
ChunkIdentifier = Annotated[
    str, StringConstraints(min_length=1, max_length=256, pattern=CHUNK_ID_PATTERN)
]
# Revisions follow the identifier rule (`*` would read as "any revision" in an index grant).
Revision = Identifier
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# The text rule (passage text, queries, run input, titles, document ids, filter values, names
# and keys), also core's `check_text`: any character but NUL, which neither PostgreSQL text nor
# jsonb can hold. Text comes from documents and is quoted back verbatim, so other controls
# (form feeds from PDFs, stray C0/C1 glyph codes) stay.
TEXT_PATTERN = "^[^\\x00]*$"
# At least one character that is not whitespace, and no NUL.
NOT_BLANK = f"^[^\\x00]*[^\\x00\\t-\\r\\x1c-\\x1f{_SPACE}][^\\x00]*$"
MAX_QUERY_BYTES = 8192


def _query_bytes(value: str) -> str:
    if len(value.encode("utf-8", errors="surrogatepass")) > MAX_QUERY_BYTES:
        raise ValueError(f"a query is at most {MAX_QUERY_BYTES} bytes of UTF-8")
    return value


# The host's query limit, 8 KiB of UTF-8: 8,192 ASCII characters, fewer of other scripts. A
# paragraph-long query (an argument to find its counter-argument) fits; 2,048 characters did
# not always.
QueryText = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_QUERY_BYTES, pattern=NOT_BLANK),
    AfterValidator(_query_bytes),
]
PassageText = Annotated[str, StringConstraints(min_length=1, pattern=NOT_BLANK)]
Text = Annotated[str, StringConstraints(pattern=TEXT_PATTERN)]


def _integral(value: object) -> object:
    # JSON Schema counts 3.0 as an integer; so does the host, in every integer field of every
    # request (the schema is the contract). 2.5 stays a float and is refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Integers within what SQLite and every JSON parser hold exactly. (The bounds sit inside the
# validator so the schema states them as `minimum`/`maximum`.)
Limit = Annotated[int, Field(ge=1, le=100), BeforeValidator(_integral)]
Positive = Annotated[int, Field(ge=1, le=2**53), BeforeValidator(_integral)]
LineNumber = Annotated[int, Field(ge=1, le=2**31 - 1), BeforeValidator(_integral)]
# Metadata filters (the server's `core.filters` states the rules; the README shows them):
# `{key: scalar}` is equality, `{key: {op: operand}}` applies `eq`, `ne`, `in`, `nin`, `gt`,
# `gte`, `lt`, `lte`, and `and`/`or` take lists of filters, nested at most three objects deep.
# Spelled out for the schema: pydantic would describe constrained keys with
# `patternProperties`, which admits any other key with any value.
MAX_FILTER_DEPTH = 3
_SCALAR: dict[str, Any] = {
    "anyOf": [{"type": "string", "pattern": TEXT_PATTERN}, {"type": ["number", "boolean", "null"]}]
}
_ORDERABLE: dict[str, Any] = {
    "anyOf": [{"type": "string", "pattern": TEXT_PATTERN}, {"type": "number"}]
}
_VALUES: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": 100, "items": _SCALAR}
_OPERATORS: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        **dict.fromkeys(("eq", "ne"), _SCALAR),
        **dict.fromkeys(("in", "nin"), _VALUES),
        **dict.fromkeys(("gt", "gte", "lt", "lte"), _ORDERABLE),
    },
}


def _filter_schema(depth: int) -> dict[str, Any]:
    clause: dict[str, Any] = {"anyOf": [_SCALAR, _OPERATORS]}
    schema: dict[str, Any] = {
        "type": "object",
        "maxProperties": 16,
        "propertyNames": {"minLength": 1, "maxLength": 256, "pattern": IDENTIFIER_PATTERN},
        "additionalProperties": clause,
    }
    if depth < MAX_FILTER_DEPTH:
        branches = {
            "type": "array",
            "minItems": 1,
            "maxItems": 16,
            "items": _filter_schema(depth + 1),
        }
        combinator = {"anyOf": [_SCALAR, _OPERATORS, branches]}
        schema["properties"] = {"and": combinator, "or": combinator}
    return schema


Filters = Annotated[
    dict[str, JsonValue],
    WithJsonSchema(
        {
            **_filter_schema(1),
            "description": (
                "Conditions on source metadata, applied with authorization before ranking: "
                "`{key: scalar}` (equality), `{key: {op: operand}}` with eq, ne, in, nin, gt, "
                "gte, lt, lte, and `and`/`or` lists of filters; at most 256 conditions."
            ),
        }
    ),
]


# A number JSON can carry: never NaN or infinite (probe "sdk", session 43: `json.dumps` raised a
# bare `ValueError` for one in metadata before validation; a host never sends one in a score).
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

# What a caller attaches to an ingested document (the `metadata` query parameter, a JSON
# object): at most 16 keys, scalar values, strings at most 256 characters. The host also
# bounds the whole at 4 KiB of ASCII-escaped JSON.
_METADATA_SCALAR: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": 256, "pattern": TEXT_PATTERN},
        {"type": ["number", "boolean", "null"]},
    ]
}
UserMetadata = Annotated[
    dict[
        str,
        Annotated[str, StringConstraints(max_length=256)] | int | FiniteFloat | bool | None,
    ],
    Field(max_length=16),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 16,
            "propertyNames": {"minLength": 1, "maxLength": 256, "pattern": IDENTIFIER_PATTERN},
            "additionalProperties": _METADATA_SCALAR,
        }
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, alias_generator=to_camel
    )


class _Response(BaseModel):
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, frozen=True, alias_generator=to_camel
    )


# --- requests -------------------------------------------------------------------------------


class LocationInput(_Request):
    """Where a passage sits in its document: 1-based page and lines, and the message id."""

    page: LineNumber | None = None
    start_line: LineNumber | None = None
    end_line: LineNumber | None = None
    document_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=998, pattern=TEXT_PATTERN)] | None
    ) = None


class SourceInput(_Request):
    """One document revision as the application names it."""

    id: Identifier
    revision: Revision
    title: Annotated[str, StringConstraints(max_length=1024, pattern=TEXT_PATTERN)] = ""
    metadata: dict[str, JsonValue] = Field(
        default_factory=dict,
        # What JSON Schema cannot say of a free-form value (a probe compared the schema with
        # the host): the rule for every nested key and string, and the bounds.
        description="Any JSON object of at most 16,384 bytes (compact UTF-8) and 32 levels; "
        "no key or string anywhere in it may hold NUL (U+0000).",
    )


class ChunkInput(_Request):
    """A prepared passage with the id the application gives it (its citation handle)."""

    id: ChunkIdentifier
    text: PassageText
    location: LocationInput = Field(default_factory=LocationInput)


class IndexRequest(_Request):
    """Replace one complete source revision with these passages."""

    corpus: Identifier
    source: SourceInput
    chunks: Annotated[tuple[ChunkInput, ...], Field(min_length=1)]
    document_sha256: Sha256Hex | None = None


class SearchRequest(_Request):
    """Search what the caller may read; `source_ids` narrows it to named sources."""

    corpus: Identifier
    query: QueryText
    source_ids: Annotated[tuple[Identifier, ...], Field(max_length=10_000)] | None = None
    limit: Limit = 8
    max_context_bytes: Positive | None = None
    filters: Filters | None = None
    # `hybrid` fuses the vector and the lexical (BM25) rankings; `dense` and `lexical` use one.
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    # Leaves out hits whose final `score` is lower (they are not counted as `truncated`).
    min_score: FiniteFloat | None = None
    # Rerank the authorized top candidates with the corpus's reranker. None: when the corpus
    # has one; True on a corpus without one is refused (`rerank-unavailable`).
    rerank: bool | None = None
    # Only revisions committed at most this many seconds ago (chosen with authorization,
    # before ranking; a revision without a recorded commit time is left out).
    max_age_s: Annotated[FiniteFloat, Field(gt=0)] | None = None


class IngestParams(_Request):
    """The query parameters of `POST /v1/retrieval/ingest` (the body is the raw document).

    `revision` defaults to the SHA-256 of the normalized content, `title` to one taken from
    the document. `metadata` is a JSON object (percent-encoded in the URL) laid over the
    metadata the document yields, key by key; searches filter on it and hits show it.
    `idle_timeout_ms` ends the ingest with `TIMEOUT` (`idle-timeout`) when that long passes
    without progress (the parse, each embedding slice, the commit), as a run's does.
    """

    corpus: Identifier
    source_id: Identifier
    revision: Revision | None = None
    title: Annotated[str, StringConstraints(max_length=1024, pattern=TEXT_PATTERN)] | None = None
    metadata: Json[UserMetadata] | None = None
    idle_timeout_ms: Positive | None = None


class DeleteRequest(_Request):
    """Delete exactly this revision of a source."""

    corpus: Identifier
    source_id: Identifier
    revision: Revision


# --- responses ------------------------------------------------------------------------------


# A score as received.
Score = FiniteFloat


def known_values(literal: Any) -> WithJsonSchema:
    """The schema of a response field open to values a newer host may add, as `Annotated[Known
    | str, known_values(Known)]`: the OpenAPI document lists the values of this protocol version
    (what this host sends), a type checker shows them, and the client accepts any string (probe
    C, session 40: a closed `Literal` turned a mutation the host had applied into
    `ProtocolError` once a newer host answered with a new status). Request fields stay closed."""
    values = list(get_args(literal))
    known = {"const": values[0]} if len(values) == 1 else {"enum": values}  # as pydantic says
    return WithJsonSchema({**known, "type": "string"})


# The values of protocol v1 in the open response fields (a newer host may send others).
IndexStatus: TypeAlias = Literal["indexed", "unchanged"]
Reclamation: TypeAlias = Literal["overwritten", "pending", "unknown"]
AuthScheme: TypeAlias = Literal["bearer"]


class Location(_Response):
    """Where a passage came from: page, line range and, in a thread, the message id. Pages
    and lines count from 1, and a range never ends before it starts."""

    page: Annotated[int, Field(ge=1)] | None = None
    start_line: Annotated[int, Field(ge=1)] | None = None
    end_line: Annotated[int, Field(ge=1)] | None = None
    document_id: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Location:
        start, end = self.start_line, self.end_line
        if start is not None and end is not None and end < start:
            raise ValueError("a location's endLine is before its startLine")
        return self


class SourceRef(_Response):
    """A source at one exact revision."""

    id: str
    revision: str


class Scope(_Response):
    """Under what a read was made: the corpus, its index version and the granted namespace."""

    corpus: str
    index_version: str
    namespace: str


class HitScores(_Response):
    """What each ranking gave a hit: `dense` a cosine similarity, `lexical` a BM25 score,
    `rerank` the reranker's relevance score (None: that ranking did not find it, or did not
    run)."""

    dense: Score | None = None
    lexical: Score | None = None
    rerank: Score | None = None


class Hit(_Response):
    """One retrieved passage with its provenance. `score` is the final one of the search's
    mode: the fused score in `hybrid` (0-1 with the default convex fusion), a cosine similarity
    in `dense`, a BM25 score in `lexical`; `scores` has each ranking's own."""

    chunk_id: str
    source: SourceRef
    location: Location
    text: str
    document_sha256: str
    score: Score
    retrieved_at: str
    scope: Scope
    scores: HitScores = Field(default_factory=HitScores)
    # The source revision's metadata as indexed (what `filters` test), an ingested document's
    # `sections` / `messages` narrowed to this passage's `section` / `message`.
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    # When the revision was committed (RFC 3339 UTC); null if written before that was recorded.
    indexed_at: str | None = None


class EmbeddingUsage(_Response):
    """Embedding metering, kept apart from generation usage."""

    requests: int = 0
    input_tokens: int = 0


class Usage(_Response):
    embedding: EmbeddingUsage = Field(default_factory=EmbeddingUsage)


class RerankUsage(_Response):
    """Reranking metering: calls, documents sent, and input tokens when the service reports
    them (0 otherwise)."""

    requests: int = 0
    documents: int = 0
    input_tokens: int = 0


class SearchUsage(Usage):
    rerank: RerankUsage = Field(default_factory=RerankUsage)


class SearchResponse(_Response):
    """Hits best first. `truncated` says matches were left out by `limit` or the byte budget."""

    hits: list[Hit]
    truncated: bool
    retrieved_at: str
    scope: Scope | None
    usage: SearchUsage


class IndexResponse(_Response):
    """`indexed` when the revision was stored, `unchanged` when it already was, identically
    (a newer host may add a status)."""

    corpus: str
    source: SourceRef
    status: Annotated[IndexStatus | str, known_values(IndexStatus)]
    chunk_count: int
    document_sha256: str
    replaced_revision: str | None
    usage: Usage


# --- a streamed ingest (`Accept: text/event-stream`) ------------------------------------------


class IngestStartedEvent(_Response):
    type: Literal["ingest.started"] = "ingest.started"
    request_id: str | None = None


class IngestProgressEvent(_Response):
    """How far the ingest got: `phase` is `parse`, `embed` or `commit`; `passages_total` is
    None until the document is parsed."""

    type: Literal["ingest.progress"] = "ingest.progress"
    phase: str
    passages_done: int | None = None
    passages_total: int | None = None


class IngestCompletedEvent(_Response):
    type: Literal["ingest.completed"] = "ingest.completed"
    result: IndexResponse


class IngestFailedEvent(_Response):
    type: Literal["ingest.failed"] = "ingest.failed"
    problem: Problem


IngestEvent = IngestStartedEvent | IngestProgressEvent | IngestCompletedEvent | IngestFailedEvent


class DeleteResponse(_Response):
    """The passages stop appearing at commit; `reclamation` says what happened to the bytes."""

    corpus: str
    source: SourceRef
    deleted_chunks: int
    reclamation: Annotated[Reclamation | str, known_values(Reclamation)]


class Problem(_Response):
    """An `application/problem+json` error body. Switch on `code`, never on `title`.

    `run_id` names the run a failure ended (a run answered without a stream: `POST /v1/runs`
    records it, and `GET /v1/runs/{id}` reads it back); None for every other error."""

    type: str
    title: str
    status: int
    code: str
    detail: str
    request_id: str
    reason: str | None = None
    run_id: str | None = None
    # Whole seconds the service behind a failure asked to be left alone (a model's 429
    # `Retry-After`, which the host did not wait out): when to try again. Never negative
    # (probe C, session 40: -100 was taken, and handed to the caller as a wait).
    retry_after: Annotated[int, Field(ge=0)] | None = None


class ProtocolLimits(_Response):
    max_body_bytes: int
    # The body of a JSON route (None: a host from before the limit, `maxBodyBytes` alone).
    max_json_body_bytes: int | None = None
    max_concurrency: int
    header_timeout_s: float
    body_timeout_s: float
    ingest_media_types: list[str] = Field(default_factory=list)
    # Seconds between a stream's heartbeat comments (`runs.heartbeatS`): the longest a streamed
    # ingest or run stays silent, so the shortest read timeout that outlasts it. None: a host
    # from before the field (the host's default then was 15 s too).
    heartbeat_s: Annotated[FiniteFloat, Field(gt=0)] | None = None


class ProtocolAuth(_Response):
    scheme: Annotated[AuthScheme | str, known_values(AuthScheme)]
    header: str = "Authorization"


class ProtocolInfo(_Response):
    """What `GET /v1/protocol` tells a caller before it holds a token."""

    name: str
    version: str
    capabilities: list[str]
    limits: ProtocolLimits
    auth: ProtocolAuth


class Health(_Response):
    status: Literal["ok"]


class Readiness(_Response):
    status: Literal["ready", "unavailable"]
    checks: dict[str, bool] = Field(default_factory=dict)


# The inspection models live in their own module; imported last, once the names it takes from
# here exist (the package imports this module first, so the cycle always resolves this way).
from retrieval_host_client.inspection_models import (  # noqa: E402
    MAX_PAGE_LIMIT as MAX_PAGE_LIMIT,
)
from retrieval_host_client.inspection_models import (  # noqa: E402
    CorporaResponse,
    CorpusInfo,
    EmbeddingLabels,
    PageParams,
    PassageListing,
    PassageParams,
    PassageResponse,
    SourceListing,
    SourceResponse,
    SourcesResponse,
    WriteOnlyCorpus,
)
from retrieval_host_client.inspection_models import (  # noqa: E402
    PageCursor as PageCursor,
)
from retrieval_host_client.inspection_models import (  # noqa: E402
    PageLimit as PageLimit,
)
from retrieval_host_client.inspection_models import (  # noqa: E402
    SourceListParams as SourceListParams,
)

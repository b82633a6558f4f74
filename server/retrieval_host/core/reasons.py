"""Every public error `reason`: one `StrEnum` per `ErrorCode` that has reasons.

A `reason` is the finer, machine-readable sub-code of a problem body (`RetrievalError.reason`):
callers switch on `code` first and on `reason` to tell cases of one code apart. The values are
the wire strings, so a member compares equal to the string clients see. `REASONS` maps each
code to its enum; the OpenAPI document publishes them per code (`http/openapi.py`), and
`tests/core/test_reasons.py` scans the package so that no reason is emitted without a member
here and no member is left unused. Codes missing from `REASONS` carry no reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from retrieval_host.core.errors import ErrorCode

__all__ = [
    "REASONS",
    "CancelledReason",
    "CapacityExceededReason",
    "ContextReplayUnavailableReason",
    "DescriptorMismatchReason",
    "DocumentTooComplexReason",
    "EmbeddingFailedReason",
    "HostBusyReason",
    "InvalidCitationReason",
    "InvalidDocumentReason",
    "InvalidRequestReason",
    "PayloadTooLargeReason",
    "PermissionDeniedReason",
    "ProviderFailedReason",
    "RerankFailedReason",
    "SourceConflictReason",
    "StoreUnavailableReason",
    "TimeoutReason",
    "UnauthenticatedReason",
    "UnsafeStoreReason",
    "UnsupportedMediaTypeReason",
    "reasons_of",
]


class UnauthenticatedReason(StrEnum):
    """Reasons of `UNAUTHENTICATED` (401); a missing or unknown token has none."""

    TOKEN_IN_QUERY = "token-in-query"  # noqa: S105 - a token sent in the query string


class PermissionDeniedReason(StrEnum):
    """Reasons of `PERMISSION_DENIED` (403); a missing grant has none, on purpose."""

    ORIGIN_NOT_ALLOWED = "origin-not-allowed"  # a browser Origin outside the allow-list
    # A listed origin's CORS preflight asking for what cross-origin requests may not use.
    CORS_METHOD_NOT_ALLOWED = "cors-method-not-allowed"  # a method other than GET and POST
    CORS_HEADER_NOT_ALLOWED = "cors-header-not-allowed"  # a header beyond the allowed ones
    CORS_PRIVATE_NETWORK_NOT_ALLOWED = "cors-private-network-not-allowed"  # Private Network Access


class SourceConflictReason(StrEnum):
    """Reasons of `SOURCE_CONFLICT` (409)."""

    CONCURRENT_WRITER = "concurrent-writer"  # another writer changed the source first
    STALE_REVISION = "stale-revision"  # a delete named a revision that is not the current one
    REVISION_CONTENT_DIFFERS = "revision-content-differs"  # same revision, other content
    REVISION_CHANGED = "revision-changed"  # a passage cursor of a revision no longer current


class DescriptorMismatchReason(StrEnum):
    """Reasons of `DESCRIPTOR_MISMATCH` (409)."""

    CHUNKING_SCHEME = "chunking-scheme"  # the corpus was chunked by another scheme


class InvalidRequestReason(StrEnum):
    """Reasons of `INVALID_REQUEST` (400/404/405/422); a wrong body shape has none."""

    DUPLICATE_KEY = "duplicate-key"  # a JSON object holds a key twice (400)
    DUPLICATE_PARAMETER = "duplicate-parameter"  # a query parameter appears twice (400)
    # A query string on a route that reads its parameters from a JSON body (400): ignored,
    # `?corpus=other` beside a body naming another corpus was a guess.
    QUERY_ON_JSON_ROUTE = "query-on-json-route"
    INVALID_UTF8 = "invalid-utf8"  # query parameters are not UTF-8 once decoded (400)
    DUPLICATE_AUTHORIZATION = "duplicate-authorization"  # two Authorization headers (400)
    DUPLICATE_HEADER = "duplicate-header"  # two Content-Type headers (400)
    BAD_HTTP = "bad-http"  # the request is not valid HTTP/1.1 (400, from the server protocol)
    JSON_DEPTH = "json-depth"  # a JSON body nests deeper than the parser follows (400)
    HEADERS_TOO_LARGE = "headers-too-large"  # the request line and headers passed 64 KiB (431)
    HOST_NOT_ALLOWED = "host-not-allowed"  # the Host header is not one this host answers to
    ROUTE = "route"  # no such route (404) or method on it (405)
    INVALID_TEXT = "invalid-text"  # a text to embed is not valid Unicode (a lone surrogate)
    VECTOR_SHAPE = "vector-shape"  # a vector does not have the corpus dimensions
    VECTOR_VALUES = "vector-values"  # a vector is not finite, or is zero
    NUL_CHARACTER = "nul-character"  # text PostgreSQL cannot store holds U+0000
    PASSAGE_TOO_LONG = "passage-too-long"  # a passage exceeds the embedding model's input
    CHUNKING_SETTINGS = "chunking-settings"  # chunking settings out of range or malformed
    CHUNKING_EXCEEDS_MODEL = "chunking-exceeds-model"  # chunks longer than the model reads
    DUPLICATE_SOURCE_ID = "duplicate-source-id"  # two files of a batch map to one source id
    OUTSIDE_ROOT = "outside-root"  # a batch file that is not under the batch's root
    UNREADABLE = "unreadable"  # a batch file could not be read (reported per file, not raised)
    EMBEDDING_CONFIG = "embedding-config"  # the OpenAI-compatible embedding config is invalid
    PROVIDER_CONFIG = "provider-config"  # the OpenAI-compatible provider config is invalid
    UNKNOWN_MODEL = "unknown-model"  # a run names a model its provider does not serve
    RERANK_CONFIG = "rerank-config"  # the reranker config is invalid
    RERANK_UNAVAILABLE = "rerank-unavailable"  # `rerank: true` on a corpus without a reranker
    IDEMPOTENCY_KEY_REUSED = "idempotency-key-reused"  # one key, two different run requests
    STEP_BUDGET_EXHAUSTED = "step-budget-exhausted"  # tools still asked for at maxGenerationSteps
    # A run spent its maxTokens before a model call it still needed.
    TOKEN_BUDGET_EXHAUSTED = "token-budget-exhausted"  # noqa: S105 - a reason, not a secret
    INVALID_CURSOR = "invalid-cursor"  # a page cursor that was edited or is of another listing
    PAGE_LIMIT = "page-limit"  # a listing's `limit` outside 1..1000 (400)
    # A prepared passage's id has ingestion's shape but is not that passage's digest (422).
    RESERVED_CHUNK_ID = "reserved-chunk-id"


class InvalidDocumentReason(StrEnum):
    """Reasons of `INVALID_DOCUMENT` (422): the document cannot be read as its type."""

    EMPTY_DOCUMENT = "empty-document"  # no bytes, no pages or no text to index
    CONTENT_TYPE_MISMATCH = "content-type-mismatch"  # the bytes are not of the declared type
    PDF_ENCRYPTED = "pdf-encrypted"  # the PDF needs a password
    PDF_MALFORMED = "pdf-malformed"  # the PDF could not be parsed
    PDF_NO_TEXT_LAYER = "pdf-no-text-layer"  # scanned pages without text (needs OCR first)
    MARKDOWN_NOT_UTF8 = "markdown-not-utf8"  # Markdown that is not UTF-8
    TEXT_NOT_UTF8 = "text-not-utf8"  # plain text that is not UTF-8
    EMAIL_MALFORMED = "email-malformed"  # a message could not be parsed


class DocumentTooComplexReason(StrEnum):
    """Reasons of `DOCUMENT_TOO_COMPLEX` (422): small on the wire, too costly to process."""

    PDF_CONTENT_STREAM = "pdf-content-stream"  # a page's decoded content stream is too large
    PDF_OPERATORS = "pdf-operators"  # too many content-stream operators (page or document)
    PASSAGES_PER_BYTE = "passages-per-byte"  # too many passages for the input's size
    HTML_ELEMENTS = "html-elements"  # an HTML document has too many tags
    CPU_LIMIT = "cpu-limit"  # the parser process ran out of CPU time
    MEMORY_LIMIT = "memory-limit"  # the parser process ran out of its address space
    PARSER_EXITED = "parser-exited"  # the parser process died (memory limit, crash)
    DEADLINE = "deadline"  # parsing and embedding took longer than the ingest deadline


class UnsupportedMediaTypeReason(StrEnum):
    """Reasons of `UNSUPPORTED_MEDIA_TYPE` (415)."""

    UNSUPPORTED_MEDIA_TYPE = "unsupported-media-type"  # a Content-Type the host cannot ingest
    UNKNOWN_SUFFIX = "unknown-suffix"  # a batch file whose suffix names no supported type


class PayloadTooLargeReason(StrEnum):
    """Reasons of `PAYLOAD_TOO_LARGE` (413): which size bound was passed."""

    BODY_TOO_LARGE = "body-too-large"  # the request body passed `maxBodyBytes`
    BYTES = "bytes"  # the document (or a PDF's text) passed `max_bytes`
    PAGES = "pages"  # a PDF has more pages than allowed
    PDF_RESOURCE_LIMIT = "pdf-resource-limit"  # reading the PDF needs too much memory or work
    MESSAGES = "messages"  # an mbox holds too many messages
    MIME_PARTS = "mime-parts"  # a message has too many MIME parts
    MIME_DEPTH = "mime-depth"  # a message nests MIME parts too deep
    HEADER_BYTES = "header-bytes"  # a message's header section is too large
    HTML_BYTES = "html-bytes"  # a document holds too many bytes of HTML
    PASSAGES = "passages"  # the document makes more passages than `max_passages`


class CapacityExceededReason(StrEnum):
    """Reasons of `CAPACITY_EXCEEDED` (413): a corpus or source bound."""

    PASSAGES_PER_SOURCE = "passages-per-source"  # a source would hold too many passages
    PASSAGE_BYTES = "passage-bytes"  # one passage is larger than allowed
    CORPUS_PAYLOAD = "corpus-payload"  # the corpus would hold too many bytes


class CancelledReason(StrEnum):
    """Reasons of `CANCELLED` (499); a client's own cancel has none."""

    SHUTDOWN = "shutdown"  # the host is shutting down and stopped waiting for the work


class TimeoutReason(StrEnum):
    """Reasons of `TIMEOUT` (408): a time limit on the caller's side."""

    IDLE_TIMEOUT = "idle-timeout"  # a run made no progress within its `idleTimeoutMs`
    REQUEST_TIMEOUT = "request-timeout"  # the request headers or body arrived too slowly


class HostBusyReason(StrEnum):
    """Reasons of `HOST_BUSY` (503)."""

    BUSY = "busy"  # the host is at its concurrency limit
    INGEST_BYTES = "ingest-bytes"  # uploads in flight hold the host's budget of document bytes
    SUBJECT = "subject-busy"  # the caller's subject holds its share of the concurrency limit
    PARSE_WORKER_UNAVAILABLE = "parse-worker-unavailable"  # a parse worker could not start


class UnsafeStoreReason(StrEnum):
    """Reasons of `UNSAFE_STORE` (500): the store location or file is refused."""

    SYMLINK = "symlink"  # the database or a directory above it is a symbolic link
    NOT_REGULAR_FILE = "not-regular-file"  # the database path is not a regular file
    NOT_A_DIRECTORY = "not-a-directory"  # a path component above the database is no directory
    FOREIGN_OWNER = "foreign-owner"  # owned by another user than the one running the host
    WRITABLE_BY_OTHERS = "writable-by-others"  # writable by group or others
    HARD_LINK = "hard-link"  # the database file has more than one hard link
    SQLITE_VERSION = "sqlite-version"  # the SQLite library is too old
    NOT_A_DATABASE = "not-a-database"  # the store path holds a file that is not SQLite
    UNRELATED_DATABASE = "unrelated-database"  # a database or schema of another application
    SCHEMA_VERSION = "schema-version"  # a schema version this host cannot read or migrate


class InvalidCitationReason(StrEnum):
    """Reasons of `INVALID_CITATION` (422): the run's answer failed the host's citation check."""

    MALFORMED_MARKER = "malformed-marker"  # a `[source:` that is not `[source:ID]`
    UNKNOWN_SOURCE = "unknown-source"  # an id outside the run's manifest
    NO_CITATION = "no-citation"  # `require` and the answer cites nothing
    QUOTE_NOT_IN_PASSAGE = "quote-not-in-passage"  # a quoted text the cited passage lacks


class StoreUnavailableReason(StrEnum):
    """Reasons of `STORE_UNAVAILABLE` (503): the store cannot serve now."""

    CLOSED = "closed"  # the store was closed
    BUSY = "busy"  # locked by another writer, or no connection free in time
    CORPUS_NOT_OPEN = "corpus-not-open"  # the corpus has not been opened on this store
    CORPUS_MISSING = "corpus-missing"  # the corpus disappeared from the database
    MISSING_DIRECTORY = "missing-directory"  # the store's directory does not exist
    MISSING_STORE = "missing-store"  # no store to open read-only, or only its WAL left
    UNWRITABLE = "unwritable"  # the store's file or directory cannot be created there
    SQLITE_ERROR = "sqlite-error"  # SQLite failed
    JOURNAL_MODE = "journal-mode"  # SQLite could not switch to WAL mode
    PRAGMA = "pragma"  # SQLite could not set a required PRAGMA
    CORRUPT_VECTOR = "corrupt-vector"  # a stored vector has the wrong shape or values
    STATEMENT_TIMEOUT = "statement-timeout"  # PostgreSQL's statement timeout passed
    CONNECTION = "connection"  # the PostgreSQL connection failed
    AUTHENTICATION = "authentication"  # PostgreSQL refused the credentials (password, role)
    DATABASE_ERROR = "database-error"  # PostgreSQL failed, or a run record disappeared
    PGVECTOR_MISSING = "pgvector-missing"  # the pgvector extension is not installed
    PGVECTOR_VERSION = "pgvector-version"  # pgvector is too old for HNSW
    INDEX_BUILD = "index-build"  # another replica has been building the index too long
    RECORD_VERSION = "record-version"  # a run record of a newer storage version


class EmbeddingFailedReason(StrEnum):
    """Reasons of `EMBEDDING_FAILED` (502): the embedding model or service failed."""

    WEIGHTS_DIGEST_MISMATCH = "weights-digest-mismatch"  # local weights fail their SHA-256
    API_KEY_UNAVAILABLE = "api-key-unavailable"  # the API key could not be read or is malformed
    TIMEOUT = "timeout"  # the service did not answer in time
    CONNECTION_FAILED = "connection-failed"  # the service could not be reached
    RATE_LIMITED = "rate-limited"  # HTTP 429
    DIMENSIONS_UNSUPPORTED = "dimensions-unsupported"  # the model refused `dimensions`
    HTTP_ERROR = "http-error"  # any other HTTP error status
    MALFORMED_RESPONSE = "malformed-response"  # not JSON, wrong shape, or too large
    MODEL_MISMATCH = "model-mismatch"  # the answer names another model than configured
    EXTRA_INDEX = "extra-index"  # a vector for an input that was not sent
    DUPLICATE_INDEX = "duplicate-index"  # two vectors for one input
    MISSING_INDEX = "missing-index"  # no vector for some inputs
    NON_FLOAT_VALUE = "non-float-value"  # an embedding holds values that are not numbers
    DIMENSIONS_MISMATCH = "dimensions-mismatch"  # a vector of other dimensions than the corpus
    NON_FINITE_VALUE = "non-finite-value"  # an embedding holds NaN or infinity
    ZERO_VECTOR = "zero-vector"  # the service returned a zero vector
    TOKEN_COUNTER = "token-counter"  # noqa: S105 - the token counter miscounted its inputs


class ProviderFailedReason(StrEnum):
    """Reasons of `PROVIDER_FAILED` (502): the generation provider failed."""

    API_KEY_UNAVAILABLE = "api-key-unavailable"  # the API key could not be read or is malformed
    TIMEOUT = "timeout"  # no byte arrived within the read timeout
    CONNECTION_FAILED = "connection-failed"  # the provider could not be reached
    RATE_LIMITED = "rate-limited"  # HTTP 429
    HTTP_ERROR = "http-error"  # any other HTTP error status
    STREAM_ENDED_EARLY = "stream-ended-early"  # the stream closed before the answer was complete
    STREAM_ERROR = "stream-error"  # the provider reported an error mid-stream
    MALFORMED_CHUNK = "malformed-chunk"  # a response or stream chunk of the wrong shape
    ANSWER_TOO_LARGE = "answer-too-large"  # one call's answer passed `MAX_ANSWER_CHARS`
    UNOFFERED_TOOL_CALL = "unoffered-tool-call"  # the model called a tool the run did not offer
    ANSWER_TRUNCATED = "answer-truncated"  # a tool call cut off at the output-token limit
    VERIFIER_UNAVAILABLE = "verifier-unavailable"  # the application's verifier could not judge
    VERIFIER_RETRYABLE = "verifier-retryable"  # the verifier failed in a way worth retrying


class RerankFailedReason(StrEnum):
    """Reasons of `RERANK_FAILED` (502): the reranking model or service failed."""

    API_KEY_UNAVAILABLE = "api-key-unavailable"  # the API key could not be read or is malformed
    TIMEOUT = "timeout"  # the service did not answer in time
    CONNECTION_FAILED = "connection-failed"  # the service could not be reached
    RATE_LIMITED = "rate-limited"  # HTTP 429
    HTTP_ERROR = "http-error"  # any other HTTP error status
    MALFORMED_RESPONSE = "malformed-response"  # not JSON, wrong shape, or too large
    WRONG_COUNT = "wrong-count"  # not one result per document asked for
    DUPLICATE_INDEX = "duplicate-index"  # two results for one document
    INDEX_OUT_OF_RANGE = "index-out-of-range"  # a result for a document that was not sent
    NON_FINITE_SCORE = "non-finite-score"  # a relevance score that is NaN or infinite


class ContextReplayUnavailableReason(StrEnum):
    """Reasons of `CONTEXT_REPLAY_UNAVAILABLE` (409): why a reused idempotency key has no
    result to replay."""

    IN_PROGRESS = "in-progress"  # the key's run has not finished (ask again once it has)
    NOT_COMPLETED = "not-completed"  # the key's run failed or was cancelled (use a new key)


REASONS: Final[Mapping[ErrorCode, type[StrEnum]]] = {
    ErrorCode.UNAUTHENTICATED: UnauthenticatedReason,
    ErrorCode.PERMISSION_DENIED: PermissionDeniedReason,
    ErrorCode.SOURCE_CONFLICT: SourceConflictReason,
    ErrorCode.DESCRIPTOR_MISMATCH: DescriptorMismatchReason,
    ErrorCode.INVALID_REQUEST: InvalidRequestReason,
    ErrorCode.INVALID_CITATION: InvalidCitationReason,
    ErrorCode.INVALID_DOCUMENT: InvalidDocumentReason,
    ErrorCode.DOCUMENT_TOO_COMPLEX: DocumentTooComplexReason,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: UnsupportedMediaTypeReason,
    ErrorCode.PAYLOAD_TOO_LARGE: PayloadTooLargeReason,
    ErrorCode.CAPACITY_EXCEEDED: CapacityExceededReason,
    ErrorCode.CONTEXT_REPLAY_UNAVAILABLE: ContextReplayUnavailableReason,
    ErrorCode.CANCELLED: CancelledReason,
    ErrorCode.TIMEOUT: TimeoutReason,
    ErrorCode.HOST_BUSY: HostBusyReason,
    ErrorCode.UNSAFE_STORE: UnsafeStoreReason,
    ErrorCode.STORE_UNAVAILABLE: StoreUnavailableReason,
    ErrorCode.EMBEDDING_FAILED: EmbeddingFailedReason,
    ErrorCode.PROVIDER_FAILED: ProviderFailedReason,
    ErrorCode.RERANK_FAILED: RerankFailedReason,
}


def reasons_of(code: ErrorCode) -> tuple[str, ...]:
    """The wire values of `code`'s reasons, in declaration order; empty for a code without."""
    enum = REASONS.get(code)
    return () if enum is None else tuple(member.value for member in enum)

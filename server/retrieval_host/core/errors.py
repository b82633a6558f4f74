"""One error type with a stable code, and the one table that maps codes to HTTP statuses."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class ErrorCode(StrEnum):
    """Stable public error codes. Clients switch on these, never on titles."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    SOURCE_UNAVAILABLE = "SOURCE_UNAVAILABLE"
    SOURCE_CONFLICT = "SOURCE_CONFLICT"
    CHUNK_ID_CONFLICT = "CHUNK_ID_CONFLICT"
    DESCRIPTOR_MISMATCH = "DESCRIPTOR_MISMATCH"
    CONTEXT_REPLAY_UNAVAILABLE = "CONTEXT_REPLAY_UNAVAILABLE"
    INVALID_REQUEST = "INVALID_REQUEST"
    INVALID_CITATION = "INVALID_CITATION"
    ANSWER_REJECTED = "ANSWER_REJECTED"
    INVALID_DOCUMENT = "INVALID_DOCUMENT"
    DOCUMENT_TOO_COMPLEX = "DOCUMENT_TOO_COMPLEX"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    CAPACITY_EXCEEDED = "CAPACITY_EXCEEDED"
    NO_RETRIEVAL_EVIDENCE = "NO_RETRIEVAL_EVIDENCE"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    HOST_BUSY = "HOST_BUSY"
    UNSAFE_STORE = "UNSAFE_STORE"
    STORE_READ_ONLY = "STORE_READ_ONLY"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    EMBEDDING_FAILED = "EMBEDDING_FAILED"
    PROVIDER_FAILED = "PROVIDER_FAILED"
    RERANK_FAILED = "RERANK_FAILED"
    INTERNAL = "INTERNAL"


STATUS: Final[Mapping[ErrorCode, int]] = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.SOURCE_UNAVAILABLE: 404,
    ErrorCode.SOURCE_CONFLICT: 409,
    ErrorCode.CHUNK_ID_CONFLICT: 409,
    ErrorCode.DESCRIPTOR_MISMATCH: 409,
    ErrorCode.CONTEXT_REPLAY_UNAVAILABLE: 409,
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.INVALID_CITATION: 422,
    ErrorCode.ANSWER_REJECTED: 422,
    ErrorCode.INVALID_DOCUMENT: 422,
    ErrorCode.DOCUMENT_TOO_COMPLEX: 422,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.CAPACITY_EXCEEDED: 413,
    ErrorCode.NO_RETRIEVAL_EVIDENCE: 422,
    ErrorCode.CANCELLED: 499,
    # A time limit on the client's side: its own `idleTimeoutMs` ran out (reason `idle-timeout`)
    # or it sent its request too slowly (`request-timeout`). A 4xx: the client chose or caused it.
    ErrorCode.TIMEOUT: 408,
    ErrorCode.HOST_BUSY: 503,
    ErrorCode.UNSAFE_STORE: 500,
    ErrorCode.STORE_READ_ONLY: 409,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.EMBEDDING_FAILED: 502,
    ErrorCode.PROVIDER_FAILED: 502,
    ErrorCode.RERANK_FAILED: 502,
    ErrorCode.INTERNAL: 500,
}

TITLES: Final[Mapping[ErrorCode, str]] = {
    ErrorCode.UNAUTHENTICATED: "Authentication required",
    ErrorCode.PERMISSION_DENIED: "Permission denied",
    ErrorCode.SOURCE_UNAVAILABLE: "Source unavailable",
    ErrorCode.SOURCE_CONFLICT: "Source conflict",
    ErrorCode.CHUNK_ID_CONFLICT: "Chunk id conflict",
    ErrorCode.DESCRIPTOR_MISMATCH: "Corpus descriptor mismatch",
    ErrorCode.CONTEXT_REPLAY_UNAVAILABLE: "Run replay unavailable",
    ErrorCode.INVALID_REQUEST: "Invalid request",
    ErrorCode.INVALID_CITATION: "Invalid citation",
    ErrorCode.ANSWER_REJECTED: "Answer rejected",
    ErrorCode.INVALID_DOCUMENT: "Invalid document",
    ErrorCode.DOCUMENT_TOO_COMPLEX: "Document too complex",
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: "Unsupported media type",
    ErrorCode.PAYLOAD_TOO_LARGE: "Payload too large",
    ErrorCode.CAPACITY_EXCEEDED: "Capacity exceeded",
    ErrorCode.NO_RETRIEVAL_EVIDENCE: "No retrieval evidence",
    ErrorCode.CANCELLED: "Cancelled",
    ErrorCode.TIMEOUT: "Timed out",
    ErrorCode.HOST_BUSY: "Host busy",
    ErrorCode.UNSAFE_STORE: "Unsafe store location",
    ErrorCode.STORE_READ_ONLY: "Store is read-only",
    ErrorCode.STORE_UNAVAILABLE: "Store unavailable",
    ErrorCode.EMBEDDING_FAILED: "Embedding failed",
    ErrorCode.PROVIDER_FAILED: "Provider failed",
    ErrorCode.RERANK_FAILED: "Reranking failed",
    ErrorCode.INTERNAL: "Internal error",
}


class RetrievalError(Exception):
    """The one error type of the product.

    `detail` is public: it is rendered to callers, so it never carries secrets, passage text or
    the content of an unexpected exception. `reason` is a finer, also public, machine-readable
    sub-code (e.g. `pdf-encrypted`) for callers that need to tell cases apart; every reason is
    a member of the code's enum in `core.reasons`.
    """

    # The run an error is about, when there is one the caller can read (`GET /v1/runs/{id}`):
    # its problem body then names it as `runId`.
    run_id: str | None = None

    def __init__(self, code: ErrorCode, detail: str, *, reason: str | None = None) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail
        # A plain `str`, not the enum member: what is pickled to a parse worker, stored in a
        # run record or compared by a caller stays exactly the wire string.
        self.reason = None if reason is None else str(reason)

    @property
    def status(self) -> int:
        return STATUS[self.code]

    @property
    def title(self) -> str:
        return TITLES[self.code]


class TransientError(RetrievalError):
    """A failure a later attempt may not meet: a rate limit, a server error, a dropped
    connection, a timeout. A provider raises it for such failures; a run that allows more
    than one attempt per model call (`RunRequest.max_attempts`) asks again when the failed
    attempt had streamed nothing. Everywhere else it is the `RetrievalError` it is.

    `retry_after_s`: how long the service asked to be left alone (its `Retry-After`), when it
    said so; a retry waits at least that long, or is not made when that is too long."""

    retry_after_s: float | None = None


def source_unavailable() -> RetrievalError:
    """The single public answer for a source that is missing *or* not authorized.

    Built in one place so the two cases cannot drift apart by a word.
    """
    return RetrievalError(
        ErrorCode.SOURCE_UNAVAILABLE, "One or more requested sources are unavailable."
    )


def permission_denied() -> RetrievalError:
    """The single public denial: a missing grant looks exactly like a corpus that does not
    exist, wherever it is decided (token grant, application authorizer, provider)."""
    return RetrievalError(ErrorCode.PERMISSION_DENIED, "This operation is not permitted.")


def store_read_only(corpus: str) -> RetrievalError:
    """The one `STORE_READ_ONLY` answer: the corpus's store indexes and deletes nothing."""
    return RetrievalError(
        ErrorCode.STORE_READ_ONLY,
        f"the store of corpus {corpus!r} is read-only (a snapshot or a replica); index and "
        "delete through a host on the writable store.",
    )

"""Typed errors of the client.

Three branches under `RetrievalHostError`:

- `RetrievalHostConnectionError` (and its `RetrievalHostTimeoutError`): no complete answer
  arrived. For a mutation the outcome is then unknown; nothing is ever retried automatically.
- `APIStatusError`: the host answered with an error status. The subclass is chosen by the
  problem's stable `code` (one table, `_CODE_CLASSES`); an unknown code, or an error body
  that is not a problem document (a proxy's HTML page), falls back to a class chosen by the
  HTTP status, and then to `APIStatusError` itself.
- `ProtocolError`: the host answered, but not as protocol v1 says (a malformed body, a
  progress event without its phase, a manifest entry that references no returned hit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from retrieval_host_client.models import Problem

__all__ = [
    "APIStatusError",
    "AuthenticationError",
    "CapacityExceededError",
    "ChunkIdConflictError",
    "ClientClosedError",
    "ConflictError",
    "ContextReplayUnavailableError",
    "DescriptorMismatchError",
    "DocumentTooComplexError",
    "EmbeddingFailedError",
    "HostBusyError",
    "HostTimeoutError",
    "InternalServerError",
    "InvalidCitationError",
    "InvalidDocumentError",
    "InvalidRequestError",
    "NoRetrievalEvidenceError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "ProviderFailedError",
    "RefusedCitationError",
    "RequestCancelledError",
    "RerankFailedError",
    "RetrievalHostConnectionError",
    "RetrievalHostError",
    "RetrievalHostTimeoutError",
    "ServiceUnavailableError",
    "SourceConflictError",
    "SourceUnavailableError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
    "UnsupportedMediaTypeError",
    "UpstreamError",
    "bounded_retry_after",
    "error_from_problem",
    "error_from_status",
]

MAX_RETRY_AFTER_S: Final = 24 * 60 * 60
"""The longest wait a `retry_after` says: a longer `Retry-After` (or problem `retryAfter`) is
read as this (probe C, session 40: 400 digits made `inf`, which `time.sleep` refuses). Capped
rather than dropped: the host reads a model's `Retry-After` with the same function, and a wait
of days must stay longer than any run waits, so the run fails and the caller is told when."""


class RetrievalHostError(Exception):
    """Base of every error this package raises. `code` is the host's stable problem code.

    Errors raised by the client itself carry client-side codes that the host never sends:
    `CONNECTION_ERROR`, `CLIENT_TIMEOUT`, `CLIENT_CLOSED` and `PROTOCOL_ERROR`.
    """

    code: str = "INTERNAL"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidCitationError(RetrievalHostError, ValueError):
    """A `[source:ID]` marker is malformed or unknown, or a required citation is absent.

    Raised by `validate_source_citations` on the client side; the host's own refusal of a
    run's citations is `RefusedCitationError`, a subclass, so one `except InvalidCitationError`
    catches both. `reason` is the host's sub-code: `malformed-marker`, `unknown-source`,
    `no-citation` (and, from the host only, `quote-not-in-passage`)."""

    code = "INVALID_CITATION"
    reason: str | None = None

    def __init__(self, message: str, *, code: str | None = None, reason: str | None = None) -> None:
        super().__init__(message, code=code)
        if reason is not None:
            self.reason = reason


# --- connection branch ------------------------------------------------------------------------


class RetrievalHostConnectionError(RetrievalHostError):
    """No complete response arrived: connect, TLS, send or receive failed.

    `request_sent` is False only when the connection failed before any byte of the request
    could be written (connect or TLS handshake errors): then the host certainly did nothing.
    Otherwise a mutation may or may not have been applied; the client never retries it.
    Re-sending an identical index request is safe (the host answers `unchanged`).
    """

    code = "CONNECTION_ERROR"

    def __init__(self, message: str, *, request_sent: bool = True, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.request_sent = request_sent


class RetrievalHostTimeoutError(RetrievalHostConnectionError):
    """The client's own timeout (connect, write, read or pool) expired."""

    code = "CLIENT_TIMEOUT"


class ClientClosedError(RetrievalHostError, RuntimeError):
    """The client or stream can no longer be used; nothing was sent. Raised by:

    - a call on a client after `close()` / `aclose()` (or closed by another thread or task
      while the call was being made): make a new client;
    - a call on an `AsyncClient`, `aclose()` included, from another event loop than the one
      that first used it (its connections belong to that loop, and `aclose()` from another
      closes nothing): make one per `asyncio.run`, and close it in its loop;
    - reading a run stream after its `with` block was left: read it inside the block.

    A stream being read when its client closes ends with `RetrievalHostConnectionError`
    instead. (A `RuntimeError` too, which is what such a call raised before.)"""

    code = "CLIENT_CLOSED"


# --- protocol branch --------------------------------------------------------------------------


class ProtocolError(RetrievalHostError):
    """The host's answer breaks protocol v1; the client refuses to pass it on."""

    code = "PROTOCOL_ERROR"


# --- status branch ----------------------------------------------------------------------------


class APIStatusError(RetrievalHostError):
    """The host answered with an error status.

    `code` is the problem's stable code (switch on it, never on `title` or `detail`); for an
    error body that is not a problem document it is `HTTP_<status>`. `problem` is the parsed
    `application/problem+json` body, or None when there was none. `retry_after` is the
    answer's `Retry-After` in seconds (the host sends one with `HOST_BUSY`, and with a
    `PROVIDER_FAILED` whose model asked to be left alone longer than a run waits), else the
    problem's `retryAfter` (a stream's `run.failed` has no headers), or None: the client
    never retries on its own, so this is the caller's hint for when to.
    """

    code = "HTTP_ERROR"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        request_id: str | None = None,
        reason: str | None = None,
        problem: Problem | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code if code is not None else f"HTTP_{status}")
        self.status = status
        self.request_id = request_id
        self.reason = reason
        self.problem = problem
        self.retry_after = retry_after

    @property
    def detail(self) -> str | None:
        """The host's human-readable detail (public; never contains secrets)."""
        return self.problem.detail if self.problem is not None else None

    @property
    def run_id(self) -> str | None:
        """The run this failure ended, recorded by the host (`get_run` reads it back); None
        when the error is not a run's."""
        return self.problem.run_id if self.problem is not None else None


class InvalidRequestError(APIStatusError):
    """The request was refused for its shape or content (`INVALID_REQUEST`, `INVALID_CITATION`;
    also any other 400/422)."""


class RefusedCitationError(InvalidRequestError, InvalidCitationError):
    """The host refused a run's answer in its citation check (`INVALID_CITATION`, 422): an
    `InvalidRequestError` with its status and problem, and an `InvalidCitationError`."""


class InvalidDocumentError(InvalidRequestError):
    """An ingested document could not be parsed or exceeds a document limit."""


class DocumentTooComplexError(InvalidDocumentError):
    """An ingested document costs more work than the host allows: content-stream size or
    operators, passages for its size, the parse worker's CPU or memory limit, or the ingest
    deadline (`reason` says which). The previous revision of the source is kept."""


class UnsupportedMediaTypeError(InvalidRequestError):
    """The document's media type is not one the host ingests."""


class AuthenticationError(APIStatusError):
    """No token, or one the host does not know (401)."""


class PermissionDeniedError(APIStatusError):
    """The token (or the application's authorizer) does not grant this operation (403)."""


class SourceUnavailableError(APIStatusError):
    """A source, revision, corpus or run is missing *or* not authorized; the host never says
    which (404)."""


class ConflictError(APIStatusError):
    """Base of the 409 conflicts."""


class SourceConflictError(ConflictError):
    """Different content under an existing revision, or a concurrent writer won."""


class ChunkIdConflictError(ConflictError):
    """A chunk id is already used by another source of the corpus."""


class DescriptorMismatchError(ConflictError):
    """The corpus was built with another embedding descriptor."""


class ContextReplayUnavailableError(ConflictError):
    """The run with this idempotency key did not complete; it cannot be replayed."""


class StoreReadOnlyError(ConflictError):
    """The corpus's store is read-only (a snapshot, a replica): it indexes and deletes
    nothing. Write through a host on the writable store."""


class PayloadTooLargeError(APIStatusError):
    """The request body exceeds the host's limit (413)."""


class CapacityExceededError(APIStatusError):
    """A corpus capacity limit (passages, bytes) would be exceeded."""


class NoRetrievalEvidenceError(APIStatusError):
    """No authorized passage matched, so the run generated nothing."""


class RequestCancelledError(APIStatusError):
    """The host cancelled the work (e.g. the client went away)."""


class HostTimeoutError(APIStatusError):
    """A time limit on the caller's side expired (408 `TIMEOUT`): the run's own
    `idleTimeoutMs` (reason `idle-timeout`), or the request was sent too slowly
    (`request-timeout`).

    Not to be confused with `RetrievalHostTimeoutError`, the client's own timeout."""


class ServiceUnavailableError(APIStatusError):
    """Base of the 503 answers: try again later."""


class HostBusyError(ServiceUnavailableError):
    """The host is at its concurrency limit; it queued nothing."""


class StoreUnavailableError(ServiceUnavailableError):
    """The vector store does not answer."""


class UpstreamError(APIStatusError):
    """Base of the 502 answers: a model provider failed."""


class EmbeddingFailedError(UpstreamError):
    """The embedding provider failed; the host did not retry."""


class ProviderFailedError(UpstreamError):
    """The generation provider failed; the host did not retry."""


class RerankFailedError(UpstreamError):
    """The corpus's reranker failed or answered out of contract; the host did not retry."""


class InternalServerError(APIStatusError):
    """An unexpected host error (5xx); details are in the host's log under `request_id`."""


_CODE_CLASSES: Final[Mapping[str, type[APIStatusError]]] = {
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "SOURCE_UNAVAILABLE": SourceUnavailableError,
    "SOURCE_CONFLICT": SourceConflictError,
    "CHUNK_ID_CONFLICT": ChunkIdConflictError,
    "DESCRIPTOR_MISMATCH": DescriptorMismatchError,
    "CONTEXT_REPLAY_UNAVAILABLE": ContextReplayUnavailableError,
    "INVALID_REQUEST": InvalidRequestError,
    "INVALID_CITATION": RefusedCitationError,
    "ANSWER_REJECTED": InvalidRequestError,
    "INVALID_DOCUMENT": InvalidDocumentError,
    "DOCUMENT_TOO_COMPLEX": DocumentTooComplexError,
    "UNSUPPORTED_MEDIA_TYPE": UnsupportedMediaTypeError,
    "PAYLOAD_TOO_LARGE": PayloadTooLargeError,
    "CAPACITY_EXCEEDED": CapacityExceededError,
    "NO_RETRIEVAL_EVIDENCE": NoRetrievalEvidenceError,
    "CANCELLED": RequestCancelledError,
    "TIMEOUT": HostTimeoutError,
    "HOST_BUSY": HostBusyError,
    "STORE_UNAVAILABLE": StoreUnavailableError,
    "EMBEDDING_FAILED": EmbeddingFailedError,
    "PROVIDER_FAILED": ProviderFailedError,
    "RERANK_FAILED": RerankFailedError,
    "UNSAFE_STORE": InternalServerError,
    "STORE_READ_ONLY": StoreReadOnlyError,
    "INTERNAL": InternalServerError,
}

_STATUS_CLASSES: Final[Mapping[int, type[APIStatusError]]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    408: HostTimeoutError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidRequestError,
    502: UpstreamError,
    503: ServiceUnavailableError,
}


def _status_class(status: int) -> type[APIStatusError]:
    cls = _STATUS_CLASSES.get(status)
    if cls is not None:
        return cls
    return InternalServerError if status >= 500 else APIStatusError


def bounded_retry_after(seconds: float | None) -> float | None:
    """`seconds` as a float (a problem's `retryAfter` may be an integer), at most
    `MAX_RETRY_AFTER_S` (`inf` included); None stays None."""
    return None if seconds is None else min(float(seconds), float(MAX_RETRY_AFTER_S))


def printable(text: str) -> str:
    """`text` with its control and other unprintable characters escaped (`\\n`, `\\x1b`):
    a host's words go into exception messages, which land in terminals and line-based logs
    (probe C, session 40: a `detail` with newlines or terminal escapes was put in verbatim)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error_from_problem(
    problem: Problem, *, status: int | None = None, retry_after: float | None = None
) -> APIStatusError:
    """The typed error for a problem document (a response body or a `run.failed` event)."""
    effective = status if status is not None else problem.status
    cls = _CODE_CLASSES.get(problem.code) or _status_class(effective)
    message = printable(
        f"{problem.code} ({effective}): {problem.detail} [request {problem.request_id}]"
    )
    if retry_after is None:
        retry_after = bounded_retry_after(problem.retry_after)
    return cls(
        message,
        status=effective,
        code=problem.code,
        request_id=problem.request_id,
        reason=problem.reason,
        problem=problem,
        retry_after=retry_after,
    )


def error_from_status(
    status: int, *, request_id: str | None = None, retry_after: float | None = None
) -> APIStatusError:
    """The typed error for an error response whose body is not a problem document."""
    cls = _status_class(status)
    suffix = f" [request {printable(request_id)}]" if request_id else ""
    return cls(
        f"HTTP {status} without a problem document{suffix}",
        status=status,
        request_id=request_id,
        retry_after=retry_after,
    )

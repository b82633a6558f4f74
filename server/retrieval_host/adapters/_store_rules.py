"""What the SQLite and PostgreSQL stores share, written once so both answer alike.

Counters (`StoreCounters`, `CounterTally`), the errors both raise with the same code, reason and
text, the checks a replacement passes before either database is touched, and the mapping of
database rows to domain values (both select the same columns in the same order). Stored vectors
become unit rows the same way in both, so both score alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, cast

import numpy as np
import numpy.typing as npt

from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import term_frequencies
from retrieval_host.core.passage_context import lexical_text
from retrieval_host.core.ports import (
    CapacityLimits,
    ReadRevision,
    StoredChunk,
    StoredSource,
    Vectors,
)
from retrieval_host.core.reasons import (
    CapacityExceededReason,
    InvalidRequestReason,
    SourceConflictReason,
    StoreUnavailableReason,
)
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.core.runs_model import RunResult
from retrieval_host.core.usage import UsageRecord
from retrieval_host.wire.run_storage import decode_result, encode_result

_Matrix = npt.NDArray[np.float32]
_usage_log = logging.getLogger("retrieval_host.usage")

# --- counters -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreCounters:
    """Monotonic scan counters (a snapshot): observe that a cancelled request stopped scanning."""

    scans_started: int = 0
    scan_batches: int = 0
    scans_cancelled: int = 0
    rows_scored: int = 0
    approximate_searches: int = 0  # dense searches ranked by a graph (SQLite) or HNSW index


class CounterTally:
    """The live `StoreCounters` of one store: added to by any thread, read as a snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = StoreCounters()

    @property
    def snapshot(self) -> StoreCounters:
        with self._lock:
            return self._counters

    def add(
        self,
        *,
        scans_started: int = 0,
        scan_batches: int = 0,
        scans_cancelled: int = 0,
        rows_scored: int = 0,
        approximate_searches: int = 0,
    ) -> None:
        with self._lock:
            c = self._counters
            self._counters = StoreCounters(
                c.scans_started + scans_started,
                c.scan_batches + scan_batches,
                c.scans_cancelled + scans_cancelled,
                c.rows_scored + rows_scored,
                c.approximate_searches + approximate_searches,
            )


class StoreBase:
    """What both vector stores' objects share: the counters, and closing as a context manager."""

    _counters: CounterTally

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    @property
    def counters(self) -> StoreCounters:
        """A snapshot of the scan counters (they only ever increase)."""
        return self._counters.snapshot


# --- errors both stores raise ---------------------------------------------------------------


def closed() -> RetrievalError:
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE, "the store is closed.", reason=StoreUnavailableReason.CLOSED
    )


@contextlib.contextmanager
def translating(
    driver_error: type[Exception], translate: Callable[[str, Any], RetrievalError], action: str
) -> Iterator[None]:
    """Turn the driver's errors raised in the block into `RetrievalError`s (ours pass through);
    the driver's message stays attached as the cause, for the log only."""
    try:
        yield
    except driver_error as exc:
        raise translate(action, exc) from exc


def busy(action: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"the database stayed locked by another writer while {action}.",
        reason=StoreUnavailableReason.BUSY,
    )


def corpus_not_open(corpus: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"corpus {corpus!r} has not been opened on this store.",
        reason=StoreUnavailableReason.CORPUS_NOT_OPEN,
    )


def missing_from_read_only(corpus: str) -> RetrievalError:
    """A read-only store asked to open a corpus it does not hold: it cannot create one. Says
    so, rather than only that the store is read-only (a PostgreSQL schema that does not exist
    read as "read-only", a black-box test)."""
    return RetrievalError(
        ErrorCode.STORE_READ_ONLY,
        f"corpus {corpus!r} does not exist in this read-only store, and a read-only store "
        "creates nothing: check its path or schema, or open it writable once first.",
    )


def corpus_missing(corpus: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.STORE_UNAVAILABLE,
        f"corpus {corpus!r} is missing from the database.",
        reason=StoreUnavailableReason.CORPUS_MISSING,
    )


def concurrent_writer() -> RetrievalError:
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT,
        "another writer changed this source first; read it again and retry if the change "
        "still applies.",
        reason=SourceConflictReason.CONCURRENT_WRITER,
    )


def stale_revision() -> RetrievalError:
    return RetrievalError(
        ErrorCode.SOURCE_CONFLICT,
        "the source is at another revision; delete names the exact current revision.",
        reason=SourceConflictReason.STALE_REVISION,
    )


def chunk_id_taken() -> RetrievalError:
    return RetrievalError(
        ErrorCode.CHUNK_ID_CONFLICT,
        "a chunk id of this revision is already used by another source in this namespace.",
    )


def capacity_exceeded(limits: CapacityLimits) -> RetrievalError:
    return RetrievalError(
        ErrorCode.CAPACITY_EXCEEDED,
        f"the corpus may hold at most {limits.max_corpus_payload_bytes} bytes of passages "
        "and vectors.",
        reason=CapacityExceededReason.CORPUS_PAYLOAD,
    )


def check_descriptor(descriptor: CorpusDescriptor, stored_json: str) -> None:
    """`DESCRIPTOR_MISMATCH` when the stored descriptor differs in a field that matters."""
    if stored_json == descriptor.canonical_json():
        return
    differing = descriptor.mismatch(stored_json)
    if differing:
        raise RetrievalError(
            ErrorCode.DESCRIPTOR_MISMATCH,
            f"corpus {descriptor.corpus_id!r} was built with a different "
            f"descriptor; differing fields: {', '.join(differing)}.",
        )


# --- replacement checks ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replacement:
    """A revision checked for `replace_source`, before any database is touched."""

    chunk_ids: list[str]
    raw: _Matrix  # the vectors as given (float32, a copy)
    unit: _Matrix  # the same rows at unit length
    metadata_json: str
    payload: int  # bytes of passage text and vectors, counted against the corpus limit
    # Each chunk's term frequencies (`core.lexical`), in the order of `chunks`: written in the
    # same transaction as the vectors.
    terms: list[dict[str, int]]


def checked_replacement(
    dims: int, analyzer: str, source: StoredSource, chunks: Sequence[StoredChunk]
) -> Replacement:
    """The checks every store makes of a revision; `INVALID_REQUEST` for the first failing."""
    if source.chunk_count != len(chunks):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, "chunk_count must equal the number of chunks."
        )
    chunk_ids = [c.chunk_id for c in chunks]
    if len(set(chunk_ids)) != len(chunk_ids) or len({c.ordinal for c in chunks}) != len(chunks):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            "chunk ids and ordinals must be unique within a source.",
        )
    raw = stack_vectors(dims, [c.vector for c in chunks], "passage vectors")
    unit = unit_rows(raw, "passage vectors")
    payload = sum(len(c.text.encode("utf-8")) for c in chunks) + raw.shape[0] * dims * 4
    metadata_json = json.dumps(
        source.metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    terms = [term_frequencies(lexical_text(c.context, c.text), analyzer) for c in chunks]
    return Replacement(chunk_ids, raw, unit, metadata_json, payload, terms)


def terms_json(terms: Mapping[str, int]) -> str:
    """A passage's term frequencies as stored (a JSON object, terms in sorted order)."""
    return json.dumps(terms, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_expected_revision(current: str | None, version: str | None, expected: str | None) -> None:
    """`SOURCE_CONFLICT` (concurrent-writer) unless the source is still at `expected`.

    `current` and `version` are the stored row's label and version (None: no row). A plain
    label is compared as a label; a `ReadRevision` (what `get_source` returned) must also name
    the very write that is stored: a label that came back since the read (deleted and
    re-created, r1 -> r3 -> r1) is another writer's write, not the one the caller replaces."""
    if current != expected:
        raise concurrent_writer()
    if isinstance(expected, ReadRevision) and expected.version != version:
        raise concurrent_writer()


def stack_vectors(dims: int, vectors: Sequence[Vectors], what: str) -> _Matrix:
    """The vectors as one new float32 matrix; `INVALID_REQUEST` for a wrong shape."""
    if not vectors:
        return np.empty((0, dims), dtype=np.float32)
    arrays = [np.asarray(v) for v in vectors]
    if any(a.shape != (dims,) for a in arrays):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"{what} must have shape ({dims},), the corpus dimensions.",
            reason=InvalidRequestReason.VECTOR_SHAPE,
        )
    # np.stack copies: the caller's arrays are never written to.
    return np.stack(arrays).astype(np.float32, copy=False)


def unit_rows(vectors: _Matrix, what: str) -> _Matrix:
    """A new array of the rows scaled to unit length; the input is never written to."""
    if not np.all(np.isfinite(vectors)):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"{what} must be finite.",
            reason=InvalidRequestReason.VECTOR_VALUES,
        )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"{what} must not be zero.",
            reason=InvalidRequestReason.VECTOR_VALUES,
        )
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def cosines(rows: _Matrix, unit_query: _Matrix) -> list[float]:
    """Each unit row's cosine with the unit query (1-D), within -1..1, the same to the last bit
    whichever path asks: a search's ranking, or the second scoring of a passage the other mode
    found (`dense_scores`). A float32 product of a batch rounds as its kernel sums, which
    depends on the batch's shape, so the two disagreed by a float32 step for about half the
    passages, hybrid's scaling moved with them and `minScore` admitted a passage at one limit
    and not at another (review V, session 41). Summed in float64 (each float32 product is
    exact there) and rounded to float32 once, any order gives the same value."""
    exact = rows.astype(np.float64) @ unit_query.astype(np.float64)
    return cast(list[float], np.clip(exact, -1.0, 1.0).astype(np.float32).tolist())


# --- rows -----------------------------------------------------------------------------------

# Then each store's version column (`stored_source`).
SOURCE_COLUMNS = (
    "source_id, revision, title, metadata_json, document_sha256, fingerprint, chunk_count"
)


def stored_source(row: Sequence[Any]) -> StoredSource:
    """A `sources` row as `get_source` answers it: the columns of `SOURCE_COLUMNS`, then the
    store's version of the write, which the revision carries (`ReadRevision`) to the
    `check_expected_revision` of a replacement. The version changes on every write of the
    source and never comes back: SQLite's is the corpus generation the write committed at (a
    counter every write bumps; row ids can be reused), PostgreSQL's the row id (an identity
    sequence; every write inserts a new row)."""
    return StoredSource(
        source_id=str(row[0]),
        revision=ReadRevision(str(row[1]), str(row[7])),
        title=str(row[2]),
        metadata=json.loads(str(row[3])),
        document_sha256=str(row[4]),
        fingerprint=str(row[5]),
        chunk_count=int(row[6]),
    )


RUN_STATUSES = "'running', 'completed', 'failed', 'cancelled'"
RUN_COLUMNS = (
    "run_id, subject, idempotency_key, fingerprint, status, created_at, result_json, "
    "error_code, provider, corpus"
)
# The columns `begin` writes (status is always 'running'), in the order of `run_insert_values`,
# then the lease (`adapters.run_leases`), which each store computes on its own clock.
RUN_INSERT_COLUMNS = (
    "run_id, subject, idempotency_key, fingerprint, status, created_at, provider, corpus, "
    "lease_until"
)


def run_insert_values(record: RunRecord) -> tuple[str | None, ...]:
    """The values of `RUN_INSERT_COLUMNS` but status, which the statement writes itself."""
    return (
        record.run_id,
        record.subject,
        record.idempotency_key,
        record.request_fingerprint,
        record.created_at,
        record.provider,
        record.corpus,
    )


def run_result_json(result: RunResult) -> str:
    """A completed run's result as stored: the versioned format of `wire.run_storage`."""
    return encode_result(result)


def run_record(row: Sequence[Any]) -> RunRecord:
    """A `runs` row, its columns in the order of `RUN_COLUMNS`."""
    (run_id, subject, key, fingerprint, status, created_at, result_json, error_code, provider,
     corpus) = row  # fmt: skip
    result = decode_result(str(result_json)) if result_json is not None else None
    return RunRecord(
        run_id=str(run_id),
        subject=str(subject),
        idempotency_key=None if key is None else str(key),
        request_fingerprint=str(fingerprint),
        status=cast(RunStatus, str(status)),
        created_at=str(created_at),
        result=result,
        error_code=None if error_code is None else str(error_code),
        provider=None if provider is None else str(provider),
        corpus=None if corpus is None else str(corpus),
    )


# Usage records (`core.usage`), in the run stores' `usage` table; columns in this order.
USAGE_COLUMNS = (
    "at, subject, operation, kind, provider, account, model, corpus, requests, input_tokens, "
    "output_tokens, documents, run_id"
)


def usage_values(record: UsageRecord) -> tuple[str | int | None, ...]:
    return (
        record.at,
        record.subject,
        record.operation,
        record.kind,
        record.provider,
        record.account,
        record.model,
        record.corpus,
        record.requests,
        record.input_tokens,
        record.output_tokens,
        record.documents,
        record.run_id,
    )


def usage_record(row: Sequence[Any]) -> UsageRecord:
    return UsageRecord(*row)


def usage_not_recorded(records: Sequence[UsageRecord], error: BaseException) -> None:
    """A sink that cannot write says so in the log and drops the records (`core.usage`)."""
    # A typed error's code and reason say which (a run store whose file was removed, probe D);
    # its detail and other exceptions' text may quote values, so they stay out.
    why = type(error).__name__
    if isinstance(error, RetrievalError):
        why = f"{error.code.value}{f' {error.reason}' if error.reason else ''}"
    _usage_log.warning("usage not recorded: %d record(s) dropped (%s)", len(records), why)

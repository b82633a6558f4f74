"""Rows shared by the SQLite and PostgreSQL adapters: database rows to domain values (both
select the same columns in the same order) and stored vectors to unit rows (so both score alike)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import StoredSource
from retrieval_host.core.run_ports import RunRecord, RunStatus
from retrieval_host.wire.run_storage import decode_result


def stored_source(row: Sequence[Any]) -> StoredSource:
    """A `sources` row: source_id, revision, title, metadata_json, document_sha256,
    fingerprint, chunk_count."""
    return StoredSource(
        source_id=str(row[0]),
        revision=str(row[1]),
        title=str(row[2]),
        metadata=json.loads(str(row[3])),
        document_sha256=str(row[4]),
        fingerprint=str(row[5]),
        chunk_count=int(row[6]),
    )


RUN_COLUMNS = (
    "run_id, subject, idempotency_key, fingerprint, status, created_at, result_json, "
    "error_code, provider, corpus"
)


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


def unit_rows(vectors: npt.NDArray[np.float32], what: str) -> npt.NDArray[np.float32]:
    """A new array of the rows scaled to unit length; the input is never written to."""
    if not np.all(np.isfinite(vectors)):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"{what} must be finite.", reason="vector-values"
        )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"{what} must not be zero.", reason="vector-values"
        )
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)

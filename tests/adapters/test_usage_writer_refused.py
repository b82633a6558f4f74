"""A group of usage records the store refuses for one record's values loses that record only
(probe H, session 40: a reranker's `2**70` tokens dropped 22 records, other searches' too); a
store that cannot be written loses the group without a retry per record."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.adapters.usage_writer import UsageWriter
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason
from retrieval_host.core.usage import UsageRecord


def _record(n: int, tokens: int | None = None) -> UsageRecord:
    return UsageRecord(
        at=f"2026-12-03T00:00:{n:02d}Z",
        subject="alice",
        operation="search",
        kind="rerank",
        provider="rerank-http",
        account="acct",
        model="m",
        corpus="rr",
        requests=1,
        input_tokens=n if tokens is None else tokens,
    )


def test_the_sqlite_store_drops_only_the_record_whose_count_it_cannot_hold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteRunStore.open(tmp_path / "runs.db")
    try:
        with caplog.at_level(logging.WARNING):
            store.record_usage([_record(1), _record(2, 2**70), _record(3)])  # one group
            kept = store.read_usage()
        assert [r.input_tokens for r in kept] == [1, 3]
        assert "usage not recorded: 1 record(s) dropped (OverflowError)" in caplog.text
        store.record_usage([_record(4, 2**63 - 1)])  # the largest count it holds
        assert [r.input_tokens for r in store.read_usage()] == [1, 3, 2**63 - 1]
    finally:
        store.close()


def test_a_store_that_cannot_be_written_loses_the_group_without_a_retry_per_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def down(records: Sequence[UsageRecord]) -> None:
        calls.append(len(records))
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the database connection failed while recording usage.",
            reason=StoreUnavailableReason.CONNECTION,
        )

    writer = UsageWriter(down)
    with caplog.at_level(logging.WARNING):
        writer.add([_record(1), _record(2), _record(3)])
        writer.flush()
    writer.close()
    assert calls == [3]
    assert "3 record(s) dropped (STORE_UNAVAILABLE connection)" in caplog.text


def test_a_store_failing_during_the_retry_loses_the_rest_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[list[int]] = []

    def write(records: Sequence[UsageRecord]) -> None:
        calls.append([r.input_tokens for r in records])
        if len(records) > 1 or records[0].input_tokens == 1:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        raise RetrievalError(ErrorCode.STORE_UNAVAILABLE, "the store file was removed.")

    writer = UsageWriter(write)
    with caplog.at_level(logging.WARNING):
        writer.add([_record(1), _record(2), _record(3), _record(4)])
        writer.flush()
    writer.close()
    assert calls == [[1, 2, 3, 4], [1], [2]]  # records 3 and 4 not tried once the store failed
    assert "1 record(s) dropped (OverflowError)" in caplog.text
    assert "3 record(s) dropped (STORE_UNAVAILABLE)" in caplog.text

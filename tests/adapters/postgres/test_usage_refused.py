"""A group of usage records PostgreSQL refuses for one record's values (a count beyond its
`bigint`) loses that record only (probe H, session 40: one reranker's `2**70` dropped 22)."""

from __future__ import annotations

import logging

import pytest

from retrieval_host.adapters.postgres import PgRunStore
from retrieval_host.core.usage import UsageRecord


def _usage(second: int, tokens: int) -> UsageRecord:
    return UsageRecord(
        f"2026-01-01T00:00:{second:02d}Z",
        "alice",
        "search",
        "rerank",
        "rr",
        "a",
        "m",
        "c",
        1,
        tokens,
    )


def test_a_count_beyond_bigint_drops_only_its_own_record(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PgRunStore.open(pg_dsn, schema=pg_schema)
    try:
        with caplog.at_level(logging.WARNING):
            store.record_usage([_usage(1, 5), _usage(2, 2**70), _usage(3, 2**63 - 1)])
            kept = store.read_usage()
        assert [r.input_tokens for r in kept] == [5, 2**63 - 1]
        assert "usage not recorded: 1 record(s) dropped (NumericValueOutOfRange)" in caplog.text
    finally:
        store.close()

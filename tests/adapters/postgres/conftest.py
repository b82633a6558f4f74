"""Fixtures of the PostgreSQL tests: one real server per session (see `tests.support.pg`)."""

from __future__ import annotations

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.pg import pg_dsn, pg_schema

__all__ = ["local_embedding", "pg_dsn", "pg_schema"]


@pytest.fixture(scope="session")
def local_embedding() -> LocalEmbedding:
    """The real local model, loaded once (about a second)."""
    return LocalEmbedding(threads=1)

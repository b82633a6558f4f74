"""Fixtures for ingestion tests: a real driver over the session's local model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.ingest_driver import Host, make_host

TokenCounter = Callable[[Sequence[str]], list[int]]


@pytest.fixture(scope="session")
def count_tokens(local_embedding: LocalEmbedding) -> TokenCounter:
    """The model's own token counter, as ingestion uses it."""
    return local_embedding.count_tokens


@pytest.fixture
def host(tmp_path: Path, local_embedding: LocalEmbedding) -> Iterator[Host]:
    """A driver over a fresh SQLite store in a private directory, default chunking."""
    h = make_host(tmp_path / "store" / "index.db", local_embedding)
    yield h
    h.store.close()

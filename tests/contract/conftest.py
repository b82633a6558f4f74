"""Fixtures of the store contract suite: every test runs once per store adapter.

To add an adapter, add its name to `STORE_KINDS` and a branch to `_open_store`; nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from retrieval_host.adapters._store_rules import StoreCounters
from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.ports import VectorStore
from tests.support.pg import pg_server_session, schema_for, shared_dsn
from tests.support.sqlite_store import descriptor

__all__ = ["pg_server_session"]  # autouse session fixture: stops the shared server at the end

STORE_KINDS = ["sqlite", "pgvector"]


class ContractStore(VectorStore, Protocol):
    """What the suite needs beyond the port: observable scan counters."""

    @property
    def counters(self) -> StoreCounters: ...


def _open_store(
    kind: str, location: Path, scan_batch_rows: int, read_only: bool = False
) -> ContractStore:
    if kind == "sqlite":
        return SqliteVectorStore.open(
            location / "store.db", scan_batch_rows=scan_batch_rows, read_only=read_only
        )
    if kind == "pgvector":
        return PgVectorStore.open(
            shared_dsn(),
            schema=schema_for(location),
            scan_batch_rows=scan_batch_rows,
            read_only=read_only,
        )
    raise AssertionError(f"unknown store kind {kind}")


@dataclass
class StoreHarness:
    """Opens instances of one adapter over one shared backing database, and closes them all."""

    kind: str
    location: Path
    opened: list[ContractStore] = field(default_factory=list)

    def open(self, scan_batch_rows: int = 8192, *, read_only: bool = False) -> ContractStore:
        store = _open_store(self.kind, self.location, scan_batch_rows, read_only)
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    h = StoreHarness(str(request.param), tmp_path)
    yield h
    h.close()


@pytest.fixture
def store(harness: StoreHarness) -> ContractStore:
    """A store with corpus `c1` (8-dimensional random vectors) already opened."""
    s = harness.open()
    s.open_corpus(descriptor("c1"))
    return s

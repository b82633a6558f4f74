"""A database file truncated, replaced or removed under a running host: every write and the
readiness probe refuse, rather than acknowledge writes no reader or restart would see."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.driver import IngestRequest
from tests.support.file_damage import DAMAGES, remove
from tests.support.ingest_driver import CORPUS, NAMESPACE, Host, context, make_host


@pytest.fixture
def noted(tmp_path: Path, local_embedding: LocalEmbedding) -> Iterator[tuple[Host, Path]]:
    """A host on its own SQLite file that has ingested one note, and that file."""
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    db = directory / "index.db"
    host = make_host(db, local_embedding)
    try:
        note = IngestRequest(CORPUS, "a", "text/markdown", b"# A\n\nThe pump runs at dawn.\n")
        host.driver.ingest_context(note, context())
        yield host, db
    finally:
        host.store.close()


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_database_file_refuses_writes_and_readiness(
    noted: tuple[Host, Path], damage: Callable[[Path], None]
) -> None:
    # A black-box test truncated the file under a running host: searches failed, but ingests
    # were answered `indexed`, /readyz said ready, and the restart found none of them.
    host, db = noted
    assert host.driver.stores_answer()
    damage(db)
    assert not host.driver.stores_answer()
    later = IngestRequest(CORPUS, "b", "text/markdown", b"# B\n\nThe gate shuts at dusk.\n")
    with pytest.raises(RetrievalError) as refused:
        host.driver.ingest_context(later, context())
    assert refused.value.code is ErrorCode.STORE_UNAVAILABLE
    assert "restart the host on an intact file" in refused.value.detail
    stored = host.store.get_source  # reads refuse too, rather than answer from a cache
    with pytest.raises(RetrievalError):
        stored(CORPUS, NAMESPACE, "a")


def test_a_database_removed_beside_its_log_is_not_replaced_by_an_empty_one(
    noted: tuple[Host, Path],
) -> None:
    # The same test removed the file, stopped the host and started it again: a new, empty
    # store was made beside the old log, and the host said ready with no source at all.
    _, db = noted
    db.unlink()  # while the host runs: its log and shared memory stay beside it
    with pytest.raises(RetrievalError) as refused:
        SqliteVectorStore.open(db)
    assert (refused.value.code, refused.value.reason) == (
        ErrorCode.STORE_UNAVAILABLE,
        "missing-store",
    )
    assert not db.exists()


def test_a_read_on_a_new_thread_after_the_file_was_removed_is_store_unavailable(
    noted: tuple[Host, Path],
) -> None:
    """A thread's first read opens its reader: on a removed file that raised apsw's
    CantOpenError, answered as an untyped 500 (a black-box test)."""
    host, db = noted
    remove(db)
    # What an authorizer asks first on every search (the example application's does).
    with ThreadPoolExecutor(max_workers=1) as fresh:
        outcome = fresh.submit(host.store.current_revisions, CORPUS, NAMESPACE).exception()
    assert isinstance(outcome, RetrievalError), outcome
    assert outcome.code is ErrorCode.STORE_UNAVAILABLE

"""A replacement is checked against the *write* it replaces, not only its label (SPEC 3.3: "one
wins, the other gets a typed conflict; never a silent overwrite").

`get_source` answers the revision as a `ReadRevision`: the label, and the store's version of
the write it was read from. Given back to `replace_source` as `expected_revision`, it makes a
write committed since the read conflict (`SOURCE_CONFLICT`, `concurrent-writer`) even when
that write left the same label: the source deleted and re-created at the label, or rolled back
r1 -> r3 -> r1. A black-box probe saw a slow writer (reading r1, embedding for seconds)
overwrite such an acknowledged write with no error and report `replacedRevision: "r1"`.

The writes in between go through another instance on the same database (another SQLite
connection, another PostgreSQL pool), as another host process would.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import CapacityLimits, ReadRevision, StoredSource
from tests.contract.conftest import ContractStore, StoreHarness
from tests.support.sqlite_store import descriptor, revision, unit_vectors

LIMITS = CapacityLimits()
Vectors = npt.NDArray[np.float32]


def vectors(seed: int, n: int = 3) -> Vectors:
    return unit_vectors(np.random.default_rng(seed), n)


def put(
    store: ContractStore, rev: str, v: Vectors, expected: str | None, *, text: str = "P"
) -> StoredSource:
    """Replace source `a` with `rev` (passages tagged with `text`); the source as written."""
    texts = [f"{text} passage {i} of a at {rev}" for i in range(len(v))]
    source, chunks = revision("a", rev, v, texts=texts)
    store.replace_source("c1", "ns", source, chunks, expected_revision=expected, limits=LIMITS)
    return source


def read(store: ContractStore) -> StoredSource:
    stored = store.get_source("c1", "ns", "a")
    assert stored is not None
    return stored


def version(source: StoredSource) -> str:
    """The version of the write `get_source` read (opaque: only compared)."""
    assert isinstance(source.revision, ReadRevision)
    return source.revision.version


def expect_concurrent_writer(call: Callable[[], object]) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        call()
    assert (excinfo.value.code, excinfo.value.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        "concurrent-writer",
    )


@pytest.fixture
def other(harness: StoreHarness) -> ContractStore:
    """Another instance on the same database: the writer that slips in between."""
    s = harness.open()
    s.open_corpus(descriptor("c1"))
    return s


def assert_stored(store: ContractStore, written: StoredSource) -> None:
    """The source is still exactly `written` (its label and content), passages included."""
    stored = read(store)
    assert (stored.revision, stored.fingerprint, stored.chunk_count) == (
        written.revision,
        written.fingerprint,
        written.chunk_count,
    )
    assert store.current_revisions("c1", "ns") == {"a": written.revision}


# --- a label that came back -----------------------------------------------------------------


def test_a_source_deleted_and_re_created_at_the_read_label_refuses_the_slow_writer(
    store: ContractStore, other: ContractStore
) -> None:
    put(store, "r1", vectors(1), None, text="P")
    was = read(store)  # the slow writer reads r1/P, then embeds r2 for a long time
    assert other.delete_source("c1", "ns", "a", "r1") == 3
    # On SQLite the new row may even reuse the deleted one's id: the version is not the id.
    q = put(other, "r1", vectors(2, 4), None, text="Q")  # acknowledged to its writer

    expect_concurrent_writer(lambda: put(store, "r2", vectors(3), was.revision))
    assert_stored(store, q)
    assert_stored(other, q)


def test_a_source_rolled_back_to_the_read_label_refuses_the_slow_writer(
    store: ContractStore, other: ContractStore
) -> None:
    put(store, "r1", vectors(1), None, text="P")
    was = read(store)
    put(other, "r3", vectors(2), "r1", text="P")
    q = put(other, "r1", vectors(4, 2), "r3", text="Q")

    expect_concurrent_writer(lambda: put(store, "r2", vectors(3), was.revision))
    assert_stored(store, q)


def test_a_label_that_came_back_with_the_same_content_is_still_another_write(
    store: ContractStore, other: ContractStore
) -> None:
    p = put(store, "r1", vectors(1), None, text="P")
    was = read(store)
    assert other.delete_source("c1", "ns", "a", "r1") == 3
    again = put(other, "r1", vectors(1), None, text="P")
    assert again.fingerprint == p.fingerprint

    expect_concurrent_writer(lambda: put(store, "r2", vectors(3), was.revision))
    assert_stored(store, again)
    # Read again, the writer may go on: the check is against what it read.
    put(store, "r2", vectors(3), read(store).revision)
    assert read(other).revision == "r2"


# --- the ordinary cases are unchanged -------------------------------------------------------


def test_a_replace_of_the_write_it_read_goes_through_and_gets_a_new_version(
    store: ContractStore, other: ContractStore
) -> None:
    put(store, "r1", vectors(1), None)
    first = read(store)
    # Reads change nothing, and every instance on the database reads the same version.
    assert version(read(store)) == version(first) == version(read(other))

    put(store, "r2", vectors(2), first.revision)
    second = read(other)
    assert second.revision == "r2" and version(second) != version(first)
    r3 = put(other, "r3", vectors(3, 5), second.revision)
    assert_stored(store, r3)


def test_a_replace_from_a_read_overtaken_by_a_new_label_conflicts_as_before(
    store: ContractStore, other: ContractStore
) -> None:
    put(store, "r1", vectors(1), None)
    was = read(store)
    r3 = put(other, "r3", vectors(2), "r1")

    expect_concurrent_writer(lambda: put(store, "r2", vectors(3), was.revision))
    assert_stored(store, r3)


def test_a_replace_of_a_source_deleted_since_the_read_conflicts(
    store: ContractStore, other: ContractStore
) -> None:
    put(store, "r1", vectors(1), None)
    was = read(store)
    assert other.delete_source("c1", "ns", "a", "r1") == 3

    expect_concurrent_writer(lambda: put(store, "r2", vectors(3), was.revision))
    assert store.get_source("c1", "ns", "a") is None


def test_a_plain_label_is_compared_as_a_label(store: ContractStore, other: ContractStore) -> None:
    """A caller of the port that names a label, not a read, gets the label check only."""
    put(store, "r1", vectors(1), None, text="P")
    put(other, "r3", vectors(2), "r1")
    put(other, "r1", vectors(4, 2), "r3", text="Q")

    r2 = put(store, "r2", vectors(3), "r1")
    assert_stored(other, r2)


# --- the read revision itself -----------------------------------------------------------------


def test_a_read_revision_is_its_label_in_every_other_respect() -> None:
    read_revision = ReadRevision("r1", "17")
    assert read_revision == "r1" and hash(read_revision) == hash("r1")
    assert str(read_revision) == "r1" and f"{read_revision}" == "r1"
    assert repr(read_revision) == repr("r1")
    for kept in (copy.deepcopy(read_revision), pickle.loads(pickle.dumps(read_revision))):
        assert isinstance(kept, ReadRevision)
        assert (kept, kept.version) == ("r1", "17")

"""A store opened read-only (a snapshot, a replica): it serves what the writable store committed,
says so, and refuses every write with `STORE_READ_ONLY` without changing anything."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.contract.conftest import StoreHarness
from tests.support.sqlite_store import descriptor, revision, unit_vectors


def test_a_read_only_store_serves_the_committed_index_and_refuses_writes(
    harness: StoreHarness,
) -> None:
    writer = harness.open()
    writer.open_corpus(descriptor("c1"))
    vectors = unit_vectors(np.random.default_rng(7), 3)
    source, chunks = revision("doc", "r1", vectors, texts=["alpha beta", "gamma", "delta"])
    writer.replace_source(
        "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
    )
    assert not writer.read_only

    reader = harness.open(read_only=True)
    assert reader.read_only
    reader.open_corpus(descriptor("c1"))
    hits = reader.search("c1", "ns", {"doc": "r1"}, vectors[1], 1, CancelToken())
    assert [h.chunk_id for h in hits] == ["doc:1"]
    lexical = reader.lexical_search(
        "c1", "ns", {"doc": "r1"}, query_terms("alpha", DEFAULT_ANALYZER), 3, CancelToken()
    )
    assert [h.chunk_id for h in lexical] == ["doc:0"]

    newer, newer_chunks = revision("doc", "r2", vectors[:1], texts=["epsilon"])
    for write in (
        lambda: reader.replace_source(
            "c1", "ns", newer, newer_chunks, expected_revision="r1", limits=CapacityLimits()
        ),
        lambda: reader.delete_source("c1", "ns", "doc", "r1"),
    ):
        with pytest.raises(RetrievalError) as excinfo:
            write()
        assert excinfo.value.code is ErrorCode.STORE_READ_ONLY
        assert excinfo.value.status == 409
    # Nothing changed, as the writable store sees it.
    stored = writer.get_source("c1", "ns", "doc")
    assert stored is not None and stored.revision == "r1" and stored.chunk_count == 3

    # A corpus the read-only store does not hold cannot be created through it.
    with pytest.raises(RetrievalError) as excinfo:
        reader.open_corpus(descriptor("c2"))
    assert excinfo.value.code is ErrorCode.STORE_READ_ONLY
    assert reader.stored_descriptor("c2") is None
    # Another descriptor for an existing corpus is still a mismatch, as for a writable store.
    with pytest.raises(RetrievalError) as excinfo:
        reader.open_corpus(descriptor("c1", dimensions=16))
    assert excinfo.value.code is ErrorCode.DESCRIPTOR_MISMATCH


def test_a_read_only_store_sees_commits_made_after_it_opened(harness: StoreHarness) -> None:
    writer = harness.open()
    writer.open_corpus(descriptor("c1"))
    reader = harness.open(read_only=True)
    reader.open_corpus(descriptor("c1"))
    vectors = unit_vectors(np.random.default_rng(8), 2)
    source, chunks = revision("late", "r1", vectors)
    writer.replace_source(
        "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
    )
    assert reader.current_revisions("c1", "ns") == {"late": "r1"}
    hits = reader.search("c1", "ns", {"late": "r1"}, vectors[0], 2, CancelToken())
    assert {h.chunk_id for h in hits} == {"late:0", "late:1"}

"""The vector store contract (core.ports.VectorStore), run over every store adapter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError, source_unavailable
from retrieval_host.core.filters import parse_filter
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate, CapacityLimits
from tests.contract.conftest import ContractStore, StoreHarness
from tests.support.sqlite_store import DIM, descriptor, revision, revision_text, unit_vectors

LIMITS = CapacityLimits()


class CancelOnCheck(CancelToken):
    """A real token that its owner cancels just before the `cancel_at`-th check."""

    def __init__(self, cancel_at: int) -> None:
        super().__init__()
        self.checks = 0
        self.cancel_at = cancel_at

    def check(self) -> None:
        self.checks += 1
        if self.checks >= self.cancel_at:
            self.cancel()
        super().check()


def put(
    store: ContractStore,
    source_id: str,
    rev: str,
    vectors: np.typing.NDArray[np.float32],
    *,
    namespace: str = "ns",
    expected: str | None = None,
    corpus: str = "c1",
    **kwargs: object,
) -> None:
    source, chunks = revision(source_id, rev, vectors, **kwargs)  # type: ignore[arg-type]
    store.replace_source(
        corpus, namespace, source, chunks, expected_revision=expected, limits=LIMITS
    )


def search(
    store: ContractStore,
    allowed: dict[str, str],
    query: np.typing.NDArray[np.float32],
    k: int = 100,
    *,
    namespace: str = "ns",
    **kwargs: object,
) -> list[Candidate]:
    return store.search(
        "c1",
        namespace,
        allowed,
        query,
        k,
        CancelToken(),
        **kwargs,  # type: ignore[arg-type]
    )


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def expect_error(code: ErrorCode, excinfo: pytest.ExceptionInfo[RetrievalError]) -> None:
    assert excinfo.value.code is code, excinfo.value


# --- descriptors ------------------------------------------------------------------------------


def test_open_corpus_stores_the_descriptor_and_refuses_a_different_one(
    harness: StoreHarness,
) -> None:
    first = harness.open()
    first.open_corpus(descriptor("c1"))
    first.open_corpus(descriptor("c1"))  # the same descriptor again is fine

    later = harness.open()
    later.open_corpus(descriptor("c1"))
    with pytest.raises(RetrievalError) as excinfo:
        later.open_corpus(descriptor("c1", dimensions=DIM * 2))
    expect_error(ErrorCode.DESCRIPTOR_MISMATCH, excinfo)
    assert "embedding.dimensions" in excinfo.value.detail
    with pytest.raises(RetrievalError) as excinfo:
        later.open_corpus(descriptor("c1", chunker="markdown"))
    expect_error(ErrorCode.DESCRIPTOR_MISMATCH, excinfo)
    assert "chunking" in excinfo.value.detail
    assert "embedding" not in excinfo.value.detail

    later.open_corpus(descriptor("c2", dimensions=DIM * 2))  # another corpus: its own identity


def test_an_operation_on_a_corpus_that_was_not_opened_is_refused(store: ContractStore) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        store.search("nope", "ns", {"a": "r1"}, unit_vectors(rng(), 1)[0], 3, CancelToken())
    assert excinfo.value.code is ErrorCode.STORE_UNAVAILABLE


# --- replacing ------------------------------------------------------------------------------


def test_get_source_returns_the_stored_revision(store: ContractStore) -> None:
    vectors = unit_vectors(rng(), 3)
    source, chunks = revision("a", "r1", vectors, metadata={"lang": "en", "tags": ["x", 1]})
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    assert store.get_source("c1", "ns", "a") == source
    assert store.get_source("c1", "other-ns", "a") is None
    assert store.get_source("c1", "ns", "b") is None


def test_a_new_revision_replaces_the_whole_old_one(store: ContractStore) -> None:
    v1, v2 = unit_vectors(rng(1), 5), unit_vectors(rng(2), 3)
    put(store, "a", "r1", v1)
    put(store, "a", "r2", v2, expected="r1")

    hits = search(store, {"a": "r2"}, v1[0])
    assert sorted(h.text for h in hits) == sorted(revision_text("a", "r2", i, 3) for i in range(3))
    assert {h.revision for h in hits} == {"r2"}
    assert search(store, {"a": "r1"}, v1[0]) == []  # the old revision is gone entirely
    stored = store.get_source("c1", "ns", "a")
    assert stored is not None
    assert (stored.revision, stored.chunk_count) == ("r2", 3)


def test_a_stale_expected_revision_is_a_conflict_and_keeps_the_current_revision(
    store: ContractStore,
) -> None:
    v = unit_vectors(rng(), 4)
    put(store, "a", "r1", v)
    for stale in (None, "r0"):
        with pytest.raises(RetrievalError) as excinfo:
            put(store, "a", "r2", v[:2], expected=stale)
        expect_error(ErrorCode.SOURCE_CONFLICT, excinfo)
        assert excinfo.value.reason == "concurrent-writer"
    with pytest.raises(RetrievalError) as excinfo:
        put(store, "b", "r1", v, expected="r0")  # expects a revision of a missing source
    expect_error(ErrorCode.SOURCE_CONFLICT, excinfo)

    hits = search(store, {"a": "r1", "b": "r1"}, v[0])
    assert sorted(h.chunk_id for h in hits) == [f"a:{i}" for i in range(4)]


def test_a_chunk_id_of_another_source_is_refused_and_keeps_the_old_revision(
    store: ContractStore,
) -> None:
    va, vb = unit_vectors(rng(1), 3), unit_vectors(rng(2), 2)
    put(store, "a", "r1", va)
    put(store, "b", "r1", vb)
    with pytest.raises(RetrievalError) as excinfo:
        put(store, "b", "r2", va, expected="r1", chunk_ids=["b:0", "a:1", "b:2"])
    expect_error(ErrorCode.CHUNK_ID_CONFLICT, excinfo)

    hits = search(store, {"a": "r1", "b": "r1"}, vb[0])
    assert sorted(h.chunk_id for h in hits) == ["a:0", "a:1", "a:2", "b:0", "b:1"]
    assert {h.revision for h in hits} == {"r1"}
    # A source may reuse its own ids; another namespace has its own id space.
    put(store, "b", "r2", vb, expected="r1", chunk_ids=["b:1", "b:0"])
    put(store, "b", "r1", va, namespace="other", chunk_ids=["a:0", "a:1", "a:2"])
    assert len(search(store, {"b": "r1"}, va[0], namespace="other")) == 3


def test_exceeding_the_corpus_payload_is_refused_and_keeps_the_old_revision(
    store: ContractStore,
) -> None:
    v = unit_vectors(rng(), 4)
    text = "x" * 100
    one = 100 + DIM * 4  # text bytes + float32 vector bytes of one passage
    limits = CapacityLimits(max_corpus_payload_bytes=5 * one)
    a1, a1_chunks = revision("a", "r1", v[:3], texts=[text] * 3)
    store.replace_source("c1", "ns", a1, a1_chunks, expected_revision=None, limits=limits)
    b1, b1_chunks = revision("b", "r1", v[:3], texts=[text] * 3)
    with pytest.raises(RetrievalError) as excinfo:
        store.replace_source("c1", "ns", b1, b1_chunks, expected_revision=None, limits=limits)
    expect_error(ErrorCode.CAPACITY_EXCEEDED, excinfo)
    a2, a2_chunks = revision("a", "r2", np.concatenate([v, v[:2]]), texts=[text] * 6)
    with pytest.raises(RetrievalError) as excinfo:
        store.replace_source("c1", "ns", a2, a2_chunks, expected_revision="r1", limits=limits)
    expect_error(ErrorCode.CAPACITY_EXCEEDED, excinfo)

    assert len(search(store, {"a": "r1"}, v[0])) == 3
    assert store.get_source("c1", "ns", "b") is None
    # The revision being replaced does not count against the limit.
    a3, a3_chunks = revision("a", "r3", np.concatenate([v, v[:1]]), texts=[text] * 5)
    store.replace_source("c1", "ns", a3, a3_chunks, expected_revision="r1", limits=limits)
    assert len(search(store, {"a": "r3"}, v[0])) == 5


# --- deleting -------------------------------------------------------------------------------


def test_delete_needs_the_exact_current_revision(store: ContractStore) -> None:
    v = unit_vectors(rng(), 4)
    put(store, "a", "r1", v)
    with pytest.raises(RetrievalError) as excinfo:
        store.delete_source("c1", "ns", "missing", "r1")
    assert str(excinfo.value) == str(source_unavailable())
    with pytest.raises(RetrievalError) as excinfo:
        store.delete_source("c1", "other-ns", "a", "r1")
    expect_error(ErrorCode.SOURCE_UNAVAILABLE, excinfo)
    with pytest.raises(RetrievalError) as excinfo:
        store.delete_source("c1", "ns", "a", "r0")
    expect_error(ErrorCode.SOURCE_CONFLICT, excinfo)
    assert len(search(store, {"a": "r1"}, v[0])) == 4

    assert store.delete_source("c1", "ns", "a", "r1") == 4
    assert store.get_source("c1", "ns", "a") is None
    assert search(store, {"a": "r1"}, v[0]) == []
    assert store.reclamation in ("overwritten", "pending", "unknown")


def test_deleted_passages_disappear_for_every_open_store(harness: StoreHarness) -> None:
    writer, reader = harness.open(), harness.open()
    writer.open_corpus(descriptor("c1"))
    reader.open_corpus(descriptor("c1"))
    v = unit_vectors(rng(), 3)
    put(writer, "a", "r1", v)
    put(writer, "b", "r1", v)
    assert len(search(reader, {"a": "r1", "b": "r1"}, v[0])) == 6

    writer.delete_source("c1", "ns", "a", "r1")
    hits = search(reader, {"a": "r1", "b": "r1"}, v[0])
    assert sorted(h.chunk_id for h in hits) == ["b:0", "b:1", "b:2"]


def test_a_commit_through_one_store_is_seen_whole_by_another(harness: StoreHarness) -> None:
    writer, reader = harness.open(), harness.open()
    writer.open_corpus(descriptor("c1"))
    reader.open_corpus(descriptor("c1"))
    v1, v2 = unit_vectors(rng(1), 2), unit_vectors(rng(2), 5)
    put(writer, "a", "r1", v1)
    assert len(search(reader, {"a": "r1"}, v1[0])) == 2
    put(writer, "a", "r2", v2, expected="r1")
    hits = search(reader, {"a": "r2"}, v2[0])
    assert sorted(h.text for h in hits) == sorted(revision_text("a", "r2", i, 5) for i in range(5))
    assert search(reader, {"a": "r1"}, v2[0]) == []


# --- current revisions ----------------------------------------------------------------------


def test_current_revisions_lists_each_source_of_one_namespace_at_its_committed_revision(
    store: ContractStore,
) -> None:
    v = unit_vectors(rng(), 2)
    assert store.current_revisions("c1", "ns") == {}
    put(store, "a", "r1", v)
    put(store, "b", "r7", v, chunk_ids=["b:x", "b:y"])
    put(store, "a", "r9", v, namespace="other-ns")
    store.open_corpus(descriptor("c2"))
    put(store, "c", "r1", v, corpus="c2")

    assert store.current_revisions("c1", "ns") == {"a": "r1", "b": "r7"}
    assert store.current_revisions("c1", "other-ns") == {"a": "r9"}
    assert store.current_revisions("c2", "ns") == {"c": "r1"}
    assert store.current_revisions("c1", "ns", ["b", "missing"]) == {"b": "r7"}
    assert store.current_revisions("c1", "ns", []) == {}
    assert store.current_revisions("c1", "no-such-ns") == {}
    mine = store.current_revisions("c1", "ns")
    mine["a"] = "forged"  # the caller's own copy
    assert store.current_revisions("c1", "ns")["a"] == "r1"


def test_current_revisions_follow_replacements_deletes_and_refused_writes(
    store: ContractStore,
) -> None:
    v = unit_vectors(rng(), 3)
    put(store, "a", "r1", v)
    put(store, "b", "r1", v, chunk_ids=["b:0", "b:1", "b:2"])
    put(store, "a", "r2", v, expected="r1")
    with pytest.raises(RetrievalError):
        put(store, "a", "r3", v, expected="r1")  # stale: a racing writer
    with pytest.raises(RetrievalError):
        put(store, "a", "r3", v, expected="r2", chunk_ids=["b:0", "a:1", "a:2"])  # taken id
    assert store.current_revisions("c1", "ns") == {"a": "r2", "b": "r1"}
    store.delete_source("c1", "ns", "b", "r1")
    assert store.current_revisions("c1", "ns") == {"a": "r2"}
    with pytest.raises(RetrievalError) as excinfo:
        store.current_revisions("nope", "ns")
    assert excinfo.value.code is ErrorCode.STORE_UNAVAILABLE  # a corpus never opened


def test_current_revisions_see_another_stores_commits_at_once(harness: StoreHarness) -> None:
    """Another connection or process commits: the next read already shows it (an authorizer
    built on it never hides a committed revision, whoever committed it)."""
    writer, reader = harness.open(), harness.open()
    writer.open_corpus(descriptor("c1"))
    reader.open_corpus(descriptor("c1"))
    v = unit_vectors(rng(), 2)
    assert reader.current_revisions("c1", "ns") == {}
    put(writer, "a", "r1", v)
    assert reader.current_revisions("c1", "ns") == {"a": "r1"}
    assert reader.current_revisions("c1", "ns", ["a"]) == {"a": "r1"}
    put(writer, "a", "r2", v, expected="r1")
    assert reader.current_revisions("c1", "ns", ["a"]) == {"a": "r2"}
    writer.delete_source("c1", "ns", "a", "r2")
    assert reader.current_revisions("c1", "ns") == {}


# --- searching ------------------------------------------------------------------------------


def test_search_ranks_only_allowed_revisions_in_the_namespace(store: ContractStore) -> None:
    r = rng(7)
    query = unit_vectors(r, 1)[0]
    allowed_vectors = unit_vectors(r, 6)
    put(store, "x", "r1", allowed_vectors)
    put(store, "y", "r1", np.stack([query, query]))  # the best match, but not granted
    put(store, "z", "r2", np.stack([query]))  # granted at r1 only: r2 must not be ranked
    put(store, "x", "r1", np.stack([query]), namespace="other", chunk_ids=["other:0"])

    hits = search(store, {"x": "r1", "z": "r1", "ghost": "r1"}, query, 3)

    assert [h.source_id for h in hits] == ["x", "x", "x"]
    expected = np.argsort(-(allowed_vectors @ query), kind="stable")[:3]
    assert [h.chunk_id for h in hits] == [f"x:{i}" for i in expected]


def test_search_applies_metadata_filters_before_ranking(store: ContractStore) -> None:
    r = rng(3)
    query = unit_vectors(r, 1)[0]
    put(store, "en", "r1", unit_vectors(r, 2), metadata={"lang": "en", "tier": 1, "flag": True})
    put(store, "de", "r1", np.stack([query]), metadata={"lang": "de", "tier": 1, "flag": False})
    allowed = {"en": "r1", "de": "r1"}

    def sources(filters: dict[str, object] | None) -> set[str]:
        where = parse_filter(filters) if filters is not None else None
        return {h.source_id for h in search(store, allowed, query, filters=where)}

    assert sources(None) == {"en", "de"}
    assert sources({"lang": "en"}) == {"en"}
    assert sources({"lang": "en", "tier": 1}) == {"en"}
    assert sources({"tier": 1.0}) == {"en", "de"}
    assert sources({"tier": True}) == set()  # JSON: true is not 1
    assert sources({"flag": False}) == {"de"}
    assert sources({"missing": None}) == set()
    assert sources({"lang": "fr"}) == set()


def test_search_returns_cosine_scores_best_first(store: ContractStore) -> None:
    r = rng(11)
    raw = r.standard_normal((40, DIM)).astype(np.float32) * r.uniform(0.1, 5, (40, 1)).astype(
        np.float32
    )
    query = (r.standard_normal(DIM) * 3).astype(np.float32)
    raw_before, query_before = raw.copy(), query.copy()
    put(store, "a", "r1", raw[:25])
    put(store, "b", "r1", raw[25:])

    hits = search(store, {"a": "r1", "b": "r1"}, query, 10)

    unit = raw.astype(np.float64) / np.linalg.norm(raw, axis=1, keepdims=True)
    cosine = unit @ (query / np.linalg.norm(query))
    best = np.argsort(-cosine)[:10]
    ids = [f"a:{i}" if i < 25 else f"b:{i - 25}" for i in best]
    assert [h.chunk_id for h in hits] == ids
    np.testing.assert_allclose([h.score for h in hits], cosine[best], atol=1e-5)
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))
    # Neither the stored nor the query arrays were touched.
    np.testing.assert_array_equal(raw, raw_before)
    np.testing.assert_array_equal(query, query_before)


def test_search_returns_the_passage_with_its_provenance(store: ContractStore) -> None:
    v = unit_vectors(rng(), 2)
    source, chunks = revision("a", "r1", v)
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    hit = search(store, {"a": "r1"}, v[1], 1)[0]
    assert hit == Candidate(
        chunk_id="a:1",
        source_id="a",
        revision="r1",
        text=chunks[1].text,
        location=Location(page=1, start_line=2, end_line=2),
        document_sha256=source.document_sha256,
        score=pytest.approx(1.0, abs=1e-6),  # type: ignore[arg-type]
    )


def test_search_with_nothing_allowed_or_k_zero_is_empty(store: ContractStore) -> None:
    v = unit_vectors(rng(), 2)
    put(store, "a", "r1", v)
    assert search(store, {}, v[0]) == []
    assert search(store, {"a": "r1"}, v[0], 0) == []
    assert search(store, {"a": "r1"}, v[0], namespace="empty") == []


def test_a_query_of_the_wrong_dimensions_is_refused(store: ContractStore) -> None:
    put(store, "a", "r1", unit_vectors(rng(), 2))
    with pytest.raises(RetrievalError) as excinfo:
        search(store, {"a": "r1"}, unit_vectors(rng(), 1, DIM + 1)[0])
    expect_error(ErrorCode.INVALID_REQUEST, excinfo)


def test_cancellation_stops_the_scan_between_batches(harness: StoreHarness) -> None:
    store = harness.open(scan_batch_rows=4)
    store.open_corpus(descriptor("c1"))
    v = unit_vectors(rng(), 40)
    for i in range(4):
        put(store, f"s{i}", "r1", v[i * 10 : (i + 1) * 10])
    allowed = {f"s{i}": "r1" for i in range(4)}
    before = store.counters

    token = CancelOnCheck(cancel_at=3)
    with pytest.raises(RetrievalError) as excinfo:
        store.search("c1", "ns", allowed, v[0], 5, token)

    expect_error(ErrorCode.CANCELLED, excinfo)
    after = store.counters
    assert after.scans_started == before.scans_started + 1
    assert after.scans_cancelled == before.scans_cancelled + 1
    assert after.scan_batches == before.scan_batches + 2  # two batches ran, the third did not
    assert after.rows_scored == before.rows_scored + 8

    assert len(store.search("c1", "ns", allowed, v[0], 5, CancelToken())) == 5
    done = store.counters
    assert done.scan_batches == after.scan_batches + 10  # 40 rows in batches of 4
    assert done.rows_scored == after.rows_scored + 40
    assert done.scans_cancelled == after.scans_cancelled


def test_a_cancelled_token_scores_nothing(store: ContractStore) -> None:
    v = unit_vectors(rng(), 3)
    put(store, "a", "r1", v)
    token = CancelToken()
    token.cancel()
    before = store.counters
    with pytest.raises(RetrievalError) as excinfo:
        store.search("c1", "ns", {"a": "r1"}, v[0], 3, token)
    expect_error(ErrorCode.CANCELLED, excinfo)
    assert store.counters.rows_scored == before.rows_scored

"""Query embedding: concurrent queries share one model call, repeats come from a cache keyed by
subject, a failure fails its whole batch and a cancelled caller leaves without stalling others.
Over the real local model; a gate holds the first call so that the others can queue."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import EmbeddingBatch
from retrieval_host.core.query_embedding import QueryEmbedder
from retrieval_host.core.waits import WouldWait, refusing_waits
from tests.support.host import wait_until
from tests.support.ingest_driver import CountingEmbedding

QUERIES = [f"how long does battery {i} last in cold weather" for i in range(8)]


class Gated(CountingEmbedding):
    """The local model, recording each call's texts; the first call waits for `release`."""

    def __init__(self, inner: LocalEmbedding, *, fail: bool = False) -> None:
        super().__init__(inner)
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.fail = fail

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(30)
        if self.fail and len(self.calls) > 1:
            raise RetrievalError(ErrorCode.EMBEDDING_FAILED, "The embedding service failed.")
        return super().embed(texts, cancel)


def _queued(embedder: QueryEmbedder, n: int) -> bool:
    return embedder.pending >= n


def test_concurrent_queries_share_one_model_call_and_get_their_own_vectors(
    local_embedding: LocalEmbedding,
) -> None:
    model = Gated(local_embedding)
    embedder = QueryEmbedder(model, max_wait_s=0.5, max_in_flight=1)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(embedder.embed, QUERIES[0], "alice", CancelToken())
        assert model.entered.wait(30)
        rest = [pool.submit(embedder.embed, q, "alice", CancelToken()) for q in QUERIES[1:]]
        wait_until(lambda: _queued(embedder, 7), timeout=30, what="seven queued queries")
        model.release.set()
        results = [first.result(30), *(f.result(30) for f in rest)]
    # One call for the seven that queued, in the order they reached the queue, which the
    # pool's threads need not keep (a run under load saw 2 before 1).
    assert len(model.calls) == 2 and model.calls[0] == QUERIES[:1]
    assert sorted(model.calls[1]) == sorted(QUERIES[1:])
    alone = local_embedding.embed(QUERIES, CancelToken())
    for i, result in enumerate(results):
        assert result.vectors.shape == (1, alone.vectors.shape[1])
        assert float(result.vectors[0] @ alone.vectors[i]) > 0.99999
    # The batch's one request goes to its first query; its tokens are split, adding up.
    usages = [r.usage for r in results[1:]]
    leader = QUERIES[1:].index(model.calls[1][0])
    assert [u.requests for u in usages] == [int(i == leader) for i in range(7)]
    batch_tokens = sum(local_embedding.count_tokens(QUERIES[1:]))
    assert sum(u.input_tokens for u in usages) == batch_tokens
    assert all(u.input_tokens > 0 for u in usages)


class Held(CountingEmbedding):
    """The local model; every call waits for `release` and counts how many are inside."""

    def __init__(self, inner: LocalEmbedding) -> None:
        super().__init__(inner)
        self.calls: list[list[str]] = []
        self.inside = 0
        self.most_inside = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        with self._lock:
            self.calls.append(list(texts))
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            assert self.release.wait(30)
            return super().embed(texts, cancel)
        finally:
            with self._lock:
                self.inside -= 1


def test_batches_run_side_by_side_up_to_the_limit_and_the_rest_wait_their_turn(
    local_embedding: LocalEmbedding,
) -> None:
    model = Held(local_embedding)
    embedder = QueryEmbedder(model, max_wait_s=0.2, max_in_flight=2)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(embedder.embed, QUERIES[0], "alice", CancelToken())
        wait_until(lambda: model.inside == 1, timeout=30, what="the first batch in the model")
        second = [pool.submit(embedder.embed, q, "alice", CancelToken()) for q in QUERIES[1:3]]
        # A second leader gathers the two and runs beside the first: both cores busy.
        wait_until(lambda: model.inside == 2, timeout=30, what="a second batch beside it")
        later = [pool.submit(embedder.embed, q, "alice", CancelToken()) for q in QUERIES[3:6]]
        wait_until(lambda: _queued(embedder, 3), timeout=30, what="three queries waiting")
        assert model.inside == 2  # no third batch: the limit holds
        model.release.set()
        results = [f.result(30) for f in (first, *second, *later)]
    assert model.most_inside == 2
    # The second batch holds what its leader gathered within its wait, in queue order (threads
    # need not keep submission order under load); every query is embedded once.
    assert model.calls[0] == QUERIES[:1] and set(model.calls[1]) <= set(QUERIES[1:3])
    assert sorted(q for call in model.calls for q in call) == sorted(QUERIES[:6])
    alone = local_embedding.embed(QUERIES[:6], CancelToken())
    for i, result in enumerate(results):
        assert float(result.vectors[0] @ alone.vectors[i]) > 0.99999


def _open(local_embedding: LocalEmbedding, **options: Any) -> tuple[Gated, QueryEmbedder]:
    """An embedder over a gated model whose gate is open (its calls are recorded)."""
    model = Gated(local_embedding)
    model.release.set()
    return model, QueryEmbedder(model, **options)


def test_a_repeated_query_comes_from_the_cache_for_the_same_subject_only(
    local_embedding: LocalEmbedding,
) -> None:
    model, embedder = _open(local_embedding, max_wait_s=0)
    first = embedder.embed("battery  life\n", "alice", CancelToken())
    again = embedder.embed(" battery life", "alice", CancelToken())  # same words, spaced apart
    assert model.calls == [["battery life"]]
    assert again.usage == EmbeddingUsage()
    np.testing.assert_array_equal(again.vectors, first.vectors)
    with pytest.raises(ValueError, match="read-only"):
        again.vectors[0, 0] = 1.0  # a cached vector cannot be changed by a caller
    embedder.embed("battery life", "bob", CancelToken())
    assert model.calls == [["battery life"], ["battery life"]]  # another subject: no reuse


def test_cached_peeks_at_a_subjects_entry_without_reordering_the_cache(
    local_embedding: LocalEmbedding,
) -> None:
    model, embedder = _open(local_embedding, cache_entries=2, max_wait_s=0)
    assert not embedder.cached("a", "alice")
    embedder.embed("a", "alice", CancelToken())
    embedder.embed("b", "alice", CancelToken())
    assert embedder.cached(" a\n", "alice")  # the same normalized text
    assert not embedder.cached("a", "bob")  # another subject's question
    # A peek is no use: "a" stays the least recently used and is evicted by "c".
    embedder.embed("c", "alice", CancelToken())
    assert not embedder.cached("a", "alice")
    assert embedder.cached("b", "alice") and embedder.cached("c", "alice")
    assert model.calls == [["a"], ["b"], ["c"]]
    off = QueryEmbedder(model, cache_entries=0, max_wait_s=0)
    off.embed("a", "alice", CancelToken())
    assert not off.cached("a", "alice")


def test_on_a_thread_refusing_waits_only_a_cached_query_is_answered(
    local_embedding: LocalEmbedding,
) -> None:
    model, embedder = _open(local_embedding, max_wait_s=0)
    embedder.embed("battery life", "alice", CancelToken())
    with refusing_waits():
        cached = embedder.embed("battery life", "alice", CancelToken())
        with pytest.raises(WouldWait, match="query embedding"):
            embedder.embed("battery life", "bob", CancelToken())  # not cached for bob
    assert model.calls == [["battery life"]]  # no model call for the refused query
    assert embedder.pending == 0  # and nothing left queued
    assert cached.usage == EmbeddingUsage()


def test_the_least_recently_used_vector_is_evicted_first(local_embedding: LocalEmbedding) -> None:
    model, embedder = _open(local_embedding, cache_entries=2, max_wait_s=0)
    for query in ("a", "b", "a", "c", "a", "b"):
        embedder.embed(query, "alice", CancelToken())
    # "b" was evicted when "c" came ("a" had been used since); "a" stayed.
    assert model.calls == [["a"], ["b"], ["c"], ["b"]]
    off = QueryEmbedder(model, cache_entries=0, max_wait_s=0)
    off.embed("a", "alice", CancelToken())
    off.embed("a", "alice", CancelToken())
    assert model.calls[-2:] == [["a"], ["a"]]


def test_a_failed_call_fails_every_query_of_its_batch(local_embedding: LocalEmbedding) -> None:
    model = Gated(local_embedding, fail=True)
    embedder = QueryEmbedder(model, max_wait_s=0.5, max_in_flight=1)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(embedder.embed, QUERIES[0], "alice", CancelToken())
        assert model.entered.wait(30)
        rest = [pool.submit(embedder.embed, q, "alice", CancelToken()) for q in QUERIES[1:4]]
        wait_until(lambda: _queued(embedder, 3), timeout=30, what="three queued queries")
        model.release.set()
        assert first.result(30).vectors.shape[0] == 1
        for future in rest:
            with pytest.raises(RetrievalError) as excinfo:
                future.result(30)
            assert excinfo.value.code is ErrorCode.EMBEDDING_FAILED
    # Nothing of the failed batch was cached: asking again calls the model again.
    model.fail = False
    embedder.embed(QUERIES[1], "alice", CancelToken())
    assert model.calls[-1] == [QUERIES[1]]


def test_a_cancelled_query_leaves_without_stalling_the_others(
    local_embedding: LocalEmbedding,
) -> None:
    model = Gated(local_embedding)
    embedder = QueryEmbedder(model, max_wait_s=0.5, max_in_flight=1)
    tokens = [CancelToken() for _ in QUERIES[1:4]]
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(embedder.embed, QUERIES[0], "alice", CancelToken())
        assert model.entered.wait(30)
        rest: list[Future[EmbeddingBatch]] = []
        # One at a time, so that the queue's order is the list's: the pool's threads could
        # otherwise enqueue in any order (seen with the suite run on two processes).
        for queued, (q, t) in enumerate(zip(QUERIES[1:4], tokens, strict=True), start=1):
            rest.append(pool.submit(embedder.embed, q, "alice", t))
            wait_until(partial(_queued, embedder, queued), timeout=30, what=f"{queued} queued")
        tokens[0].cancel()  # the query next in line to lead
        with pytest.raises(RetrievalError) as excinfo:
            rest[0].result(30)
        assert excinfo.value.code is ErrorCode.CANCELLED
        model.release.set()
        assert [f.result(30).vectors.shape[0] for f in (first, *rest[1:])] == [1, 1, 1]
    assert model.calls == [QUERIES[:1], QUERIES[2:4]]  # the cancelled query was never embedded


def test_the_model_call_sees_its_callers_cancel(local_embedding: LocalEmbedding) -> None:
    seen: list[CancelToken] = []

    class Watching(Gated):
        def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
            seen.append(cancel)
            return super().embed(texts, cancel)

    model = Watching(local_embedding)
    embedder = QueryEmbedder(model, max_wait_s=0)
    caller = CancelToken()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(embedder.embed, QUERIES[0], "alice", caller)
        assert model.entered.wait(30)
        assert not seen[0].cancelled
        caller.cancel()  # an adapter that aborts on cancel can now abort this call
        assert seen[0].cancelled
        with pytest.raises(RetrievalError) as excinfo:
            seen[0].check()
        assert excinfo.value.code is ErrorCode.CANCELLED
        model.release.set()
        with pytest.raises(RetrievalError) as excinfo:
            future.result(30)  # the model stopped for the one caller who no longer waits
        assert excinfo.value.code is ErrorCode.CANCELLED

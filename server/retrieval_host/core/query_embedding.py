"""Embedding search queries: concurrent queries in one model call, repeated ones from a cache.

A text search spends most of its time embedding its query: one model call per query, however
many arrive at once. `QueryEmbedder` sits between the service and an `EmbeddingAdapter`:

- **Micro-batching.** A query that arrives while fewer than `max_in_flight` batches are
  gathering or running becomes a *leader*: it waits at most `max_wait_s` (or until
  `max_batch` queries are pending), then embeds the pending queries (its own first) in one
  call and hands each its row; the others wait for their row, or for their turn to lead when
  a batch ends. One query alone pays the wait and nothing else; the default wait is none
  (queries gather anyway while two batches run; measured on the quickstart host together
  with cheaper small calls, one client 92 -> 122 req/s and 16 clients 417 -> 520, the latter
  on a load whose clients repeated each other's queries, mostly answered from the cache).
  With unique queries on two cores the model's time per query hardly falls with the batch
  (batches of ~5 padded to their longest query, the cores shared with the requests' Python):
  see `bench/README.md`, session 19.
  Several batches run at once (by default 2, one per core of a CPU model with one thread
  per call): one leader at a time left the other cores idle, and measured slower than no
  batching at all.
  A failed call fails every query of its batch with the same error. A query whose
  caller is cancelled while it waits leaves the batch without disturbing the others; the call
  itself sees a token that is cancelled once *every* caller of its batch is (for a query
  alone: its caller's), so an adapter that aborts on cancel aborts only work nobody wants.
- **A cache of query vectors** (least recently used, `cache_entries`), keyed by the embedding
  descriptor, the *subject* and the whitespace-normalized text (the text embedded is the
  normalized one, so equal keys mean equal vectors). Keyed by subject so that one caller's
  latency or usage cannot tell whether another asked the same question. A cached vector costs
  no embedding usage.

Usage of a batched call is split over its queries: input tokens in proportion to each
query's own token count (largest remainders, so the shares add up to what the model
reported), and its one request to the leader.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import EmbeddingAdapter, EmbeddingBatch, Vectors
from retrieval_host.core.waits import refuse_wait

__all__ = [
    "DEFAULT_CACHE_ENTRIES",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_WAIT_S",
    "QueryEmbedder",
]

DEFAULT_CACHE_ENTRIES: Final = 4096
DEFAULT_MAX_BATCH: Final = 32
DEFAULT_MAX_IN_FLIGHT: Final = 2
DEFAULT_MAX_WAIT_S: Final = 0.0
# How often a waiting query looks at its caller's cancel token.
_CANCEL_POLL_S: Final = 0.05


@dataclass(eq=False)  # compared by identity: two queries may hold the same text
class _Pending:
    text: str
    cancel: CancelToken
    # Set when the query is done, or when it is its turn to lead the next batch.
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    done: bool = False
    vector: Vectors | None = None
    usage: EmbeddingUsage = field(default_factory=EmbeddingUsage)
    error: BaseException | None = None


class QueryEmbedder:
    """One adapter's query embeddings, batched and cached (see the module docstring)."""

    def __init__(
        self,
        embedding: EmbeddingAdapter,
        *,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if cache_entries < 0 or max_batch < 1 or max_wait_s < 0 or max_in_flight < 1:
            raise ValueError(
                "cache_entries >= 0, max_batch >= 1, max_wait_s >= 0 and max_in_flight >= 1"
            )
        self._max_in_flight = max_in_flight
        self._embedding = embedding
        self._cache_entries = cache_entries
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._cache: OrderedDict[tuple[str, str, str], Vectors] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Pending queries in arrival order (leaders included until a batch takes them), and
        # how many leaders are gathering or running a batch.
        self._queue: list[_Pending] = []
        self._lock = threading.Condition()
        self._leaders = 0
        self._descriptor_key = repr(embedding.descriptor)

    @property
    def embedding(self) -> EmbeddingAdapter:
        return self._embedding

    @property
    def pending(self) -> int:
        """Queries waiting for a batch (not counting one being embedded)."""
        with self._lock:
            return len(self._queue)

    def cached(self, query: str, subject: str) -> bool:
        """Whether `embed` would answer this subject's query from the cache right now (a
        peek: the entry's place in the cache is not changed)."""
        if self._cache_entries == 0:
            return False
        key = (self._descriptor_key, subject, " ".join(query.split()))
        with self._cache_lock:
            return key in self._cache

    def embed(self, query: str, subject: str, cancel: CancelToken) -> EmbeddingBatch:
        """The query's unit vector (shape (1, dimensions)) and what embedding it cost."""
        text = " ".join(query.split())
        key = (self._descriptor_key, subject, text)
        cached = self._cached(key)
        if cached is not None:
            return EmbeddingBatch(cached[np.newaxis, :], EmbeddingUsage())
        refuse_wait("a query embedding")  # on the event loop (`core.waits`)
        cancel.check()
        pending = _Pending(text, cancel)
        with self._lock:
            self._queue.append(pending)
            if self._leaders < self._max_in_flight:
                self._leaders += 1
                pending.lead = True
            else:
                self._lock.notify_all()  # a gathering leader may have a full batch now
        while True:
            with self._lock:
                done, lead = pending.done, pending.lead and not pending.done
            if done:
                break
            if lead:
                # Leading is not optional once handed over: the queries behind wait on it.
                self._lead(pending)
                continue
            if not pending.wake.wait(_CANCEL_POLL_S):
                self._leave_if_cancelled(pending, cancel)
            pending.wake.clear()
        if pending.error is not None:
            raise pending.error
        assert pending.vector is not None
        self._remember(key, pending.vector)
        return EmbeddingBatch(pending.vector[np.newaxis, :], pending.usage)

    def _leave_if_cancelled(self, pending: _Pending, cancel: CancelToken) -> None:
        """Raise the caller's cancel, leaving the queue first so that the lead is never
        handed to a query nobody waits for (a query already in a running batch just loses
        its row)."""
        with self._lock:
            if pending.lead or pending.done:
                return  # its turn to lead, or its row is ready: no leaving now
            try:
                cancel.check()
            except BaseException:
                if pending in self._queue:
                    self._queue.remove(pending)
                raise

    def _lead(self, me: _Pending) -> None:
        """Wait for company (bounded), embed one batch holding `me`, then retire, handing the
        lead to pending queries while fewer than `max_in_flight` lead."""
        deadline = time.monotonic() + self._max_wait_s
        with self._lock:
            while len(self._queue) < self._max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            # Never another leader's query: each leader's batch holds its own.
            others = [p for p in self._queue if not p.lead][: self._max_batch - 1]
            batch = [me, *others]
            taken = {id(p) for p in batch}
            self._queue = [p for p in self._queue if id(p) not in taken]
        self._run(batch)
        with self._lock:
            for pending in batch:
                pending.done = True
                pending.wake.set()
            self._retire()

    def _retire(self) -> None:
        """One leader less; pending queries lead in arrival order while there is room. Called
        with the lock held."""
        self._leaders -= 1
        for pending in self._queue:
            if self._leaders >= self._max_in_flight:
                break
            if not pending.lead:
                pending.lead = True
                self._leaders += 1
                pending.wake.set()

    def _run(self, batch: Sequence[_Pending]) -> None:
        try:
            # One caller's cancel must not fail the others' queries: cancelled when all are.
            result = self._embedding.embed([p.text for p in batch], _AllCancelled(batch))
            shares = _token_shares(self._embedding, batch, result.usage)
            for i, pending in enumerate(batch):
                row = np.array(result.vectors[i], dtype=np.float32)
                row.setflags(write=False)
                pending.vector = row
                pending.usage = EmbeddingUsage(1 if i == 0 else 0, shares[i])
        except BaseException as error:  # every query of the batch gets the same failure
            for pending in batch:
                pending.error = error

    # --- the cache -----------------------------------------------------------------------------

    def _cached(self, key: tuple[str, str, str]) -> Vectors | None:
        if self._cache_entries == 0:
            return None
        with self._cache_lock:
            vector = self._cache.get(key)
            if vector is not None:
                self._cache.move_to_end(key)
            return vector

    def _remember(self, key: tuple[str, str, str], vector: Vectors) -> None:
        if self._cache_entries == 0:
            return
        with self._cache_lock:
            self._cache[key] = vector
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)


class _AllCancelled(CancelToken):
    """Cancelled when every query of a batch is; its check raises as the first caller's."""

    def __init__(self, batch: Sequence[_Pending]) -> None:
        super().__init__()
        self._tokens = [p.cancel for p in batch]

    @property
    def cancelled(self) -> bool:
        return all(t.cancelled for t in self._tokens)

    def progress(self) -> None:
        for token in self._tokens:
            token.progress()

    def idle_expired(self) -> bool:
        return all(t.idle_expired() for t in self._tokens)

    def check(self) -> None:
        if all(t.cancelled or t.idle_expired() for t in self._tokens):
            self._tokens[0].check()


def _token_shares(
    embedding: EmbeddingAdapter, batch: Sequence[_Pending], usage: EmbeddingUsage
) -> list[int]:
    """The batch's input tokens split over its queries in proportion to their own counts."""
    if len(batch) == 1:
        return [usage.input_tokens]
    counts = embedding.count_tokens([p.text for p in batch])
    total = sum(counts) or 1
    exact = [usage.input_tokens * c / total for c in counts]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(batch)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[: usage.input_tokens - sum(shares)]:
        shares[i] += 1
    return shares

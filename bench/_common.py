"""Shared by the bench scripts: synthetic clustered vectors, a store filled through its public
API, interleaved timing rounds and the pass/miss verdicts.

Why synthetic vectors: embedding 1M passages with the local model would take about five hours
on this machine. The vectors are clustered like text embeddings (points around centres in a
low-dimensional latent space, projected to 384 dimensions, normalised), not uniform noise, so
the top 10 of a query are close neighbours, as with real text. Every script says so in its
output.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.sqlite.grant_cache import DEFAULT_GRANT_CACHE_BYTES
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor, EmbeddingDescriptor
from retrieval_host.core.models import Location
from retrieval_host.core.ports import (
    Candidate,
    CapacityLimits,
    StoredChunk,
    StoredSource,
    VectorStore,
)

REPO = Path(__file__).resolve().parents[1]
DIMS = 384
CORPUS = "bench"
NAMESPACE = "ns"
REVISION = "r1"
Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Clusters:
    """A fixed distribution of clustered unit vectors (same seed, same vectors)."""

    seed: int = 20260101
    dims: int = DIMS
    clusters: int = 1000
    latent: int = 32
    spread: float = 0.35
    noise: float = 0.03

    def sample(self, n: int, stream: int) -> Matrix:
        """`n` unit rows; `stream` picks an independent sequence (corpus, queries, ...)."""
        shape_rng = np.random.default_rng(self.seed)
        centres = shape_rng.standard_normal((self.clusters, self.latent)).astype(np.float32)
        projection = (
            shape_rng.standard_normal((self.latent, self.dims)) / np.sqrt(self.latent)
        ).astype(np.float32)
        rng = np.random.default_rng([self.seed, stream])
        out = np.empty((n, self.dims), dtype=np.float32)
        step = 65_536  # in slices: a 1M x 384 float64 temporary would need 3 GB
        for start in range(0, n, step):
            m = min(step, n - start)
            latent = centres[rng.integers(0, self.clusters, m)]
            latent += self.spread * rng.standard_normal((m, self.latent), dtype=np.float32)
            rows = latent @ projection
            rows += self.noise * rng.standard_normal((m, self.dims), dtype=np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            out[start : start + m] = rows
        return out

    def describe(self) -> str:
        return (
            f"SYNTHETIC clustered unit vectors, not embeddings of text ({self.clusters} clusters "
            f"in a {self.latent}-dim latent space projected to {self.dims} dims, spread "
            f"{self.spread}, noise {self.noise}, seed {self.seed})"
        )


def descriptor(dims: int = DIMS, corpus: str = CORPUS) -> CorpusDescriptor:
    """The corpus identity of synthetic vectors (no real embedding model produced them)."""
    embedding = EmbeddingDescriptor(
        provider_id="bench-synthetic",
        vendor="synthetic",
        account_id="none",
        auth_mode="none",
        model="clustered-unit",
        dimensions=dims,
    )
    return CorpusDescriptor(corpus, "bench-v1", embedding)


def source_id(number: int) -> str:
    return f"s{number:06d}"


def fill(
    store: VectorStore,
    vectors: Matrix,
    per_source: int,
    *,
    texts: Sequence[str] | None = None,
    corpus: str = CORPUS,
) -> list[str]:
    """Write the vectors as sources of `per_source` passages each, through `replace_source`."""
    limits = CapacityLimits(
        max_passages_per_source=max(per_source, 1), max_corpus_payload_bytes=64 * 1024**3
    )
    ids: list[str] = []
    for start in range(0, len(vectors), per_source):
        sid = source_id(start // per_source)
        rows = vectors[start : start + per_source]
        source = StoredSource(sid, REVISION, sid, {}, "0" * 64, "f" * 64, len(rows))
        chunks = [
            StoredChunk(
                f"{sid}:{i}",
                i,
                texts[start + i] if texts is not None else f"passage {i} of {sid}",
                Location(),
                row,
            )
            for i, row in enumerate(rows)
        ]
        store.replace_source(
            corpus, NAMESPACE, source, chunks, expected_revision=None, limits=limits
        )
        ids.append(sid)
    return ids


@contextmanager
def private_directory(prefix: str) -> Iterator[Path]:
    """A private (0700) temporary directory, removed afterwards: the store insists on one."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        path = Path(name)
        path.chmod(0o700)
        yield path


@contextmanager
def filled_store(
    directory: Path,
    vectors: Matrix,
    per_source: int,
    *,
    texts: Sequence[str] | None = None,
    grant_cache_bytes: int | None = None,
    approximate_min_rows: int = 0,
) -> Iterator[tuple[SqliteVectorStore, list[str]]]:
    """A SQLite store in `directory` holding the vectors (closed afterwards). Searches allowed
    every source scan exactly unless `approximate_min_rows` is set: the scan benches measure
    the scan, and a graph built in the background would take over in the middle of a run."""
    store = SqliteVectorStore.open(
        directory / "store.sqlite",
        grant_cache_bytes=(
            DEFAULT_GRANT_CACHE_BYTES if grant_cache_bytes is None else grant_cache_bytes
        ),
        approximate_min_rows=approximate_min_rows,
    )
    try:
        store.open_corpus(descriptor(vectors.shape[1]))
        ids = fill(store, vectors, per_source, texts=texts)
        yield store, ids
    finally:
        store.close()


def stored_rows(store: SqliteVectorStore, rows: int) -> Matrix:
    """The store's own in-memory rows 0..rows-1 (a bench-only look inside the store).

    The floor reads these very bytes, not a copy of them: a copy lives at other addresses,
    and on this machine (a 480 MiB L3) whichever array was read last is partly cache-resident,
    so a floor over a copy that ran just before the search would have evicted the search's
    rows. Reading the same memory leaves the cache to favour neither side. `fill` writes the
    rows in source order, so row `i` is the `i`-th vector given to it.
    """
    matrix: Matrix = store._state(CORPUS).segments[NAMESPACE].matrix
    if len(matrix) < rows:
        raise ValueError(f"the store holds {len(matrix)} rows, not {rows}")
    return matrix[:rows]


def search(
    store: SqliteVectorStore, allowed: Mapping[str, str], query: Matrix, k: int = 10
) -> list[Candidate]:
    return store.search(CORPUS, NAMESPACE, allowed, query, k, CancelToken())


def exact_top(vectors: Matrix, rows: npt.NDArray[np.int64], query: Matrix, k: int) -> list[int]:
    """Brute-force top k (in float64) among `rows`: the reference for recall."""
    scores = vectors[rows].astype(np.float64) @ query.astype(np.float64)
    return [int(rows[i]) for i in np.argsort(-scores, kind="stable")[:k]]


def recall_at_k(
    found: Iterable[str],
    truth: Sequence[int],
    vectors: Matrix,
    query: Matrix,
    per_source: int,
) -> float:
    """Share of the true top k (rows) that the found chunk ids hold; a near-tie (within 1e-6)
    counts as found."""
    if not truth:
        return 1.0
    q = query.astype(np.float64)
    kth = float(vectors[truth[-1]].astype(np.float64) @ q)
    found_rows = {_row_of(chunk_id, per_source) for chunk_id in found}
    hits = len(found_rows & set(truth))
    # A returned row scoring within rounding of the k-th true score is as good an answer.
    near = sum(
        1
        for row in found_rows - set(truth)
        if float(vectors[row].astype(np.float64) @ q) >= kth - 1e-6
    )
    return min(len(truth), hits + near) / len(truth)


def _row_of(chunk_id: str, per_source: int) -> int:
    sid, _, ordinal = chunk_id.partition(":")
    return int(sid[1:]) * per_source + int(ordinal)


# --- timing ---------------------------------------------------------------------------------


@dataclass
class Rounds:
    """Interleaved timing: each round runs every variant once, in a shuffled order, so a noisy
    neighbour slows all variants of a round alike; ratios are taken within a round."""

    variants: dict[str, Callable[[], object]]
    times: dict[str, list[float]] = field(default_factory=dict)

    def run(self, rounds: int, *, seed: int = 1, warmup: int = 1) -> Rounds:
        order = random.Random(seed)
        for _ in range(warmup):
            for work in self.variants.values():
                work()
        self.times = {name: [] for name in self.variants}
        for _ in range(rounds):
            names = list(self.variants)
            order.shuffle(names)
            for name in names:
                started = time.perf_counter()
                self.variants[name]()
                self.times[name].append(time.perf_counter() - started)
        return self

    def median_ms(self, name: str) -> float:
        return statistics.median(self.times[name]) * 1e3

    def ratio(self, name: str, base: str | Sequence[str]) -> float:
        """Median over rounds of time(name) / time(base); with several bases, the fastest of
        them in that round."""
        bases = [base] if isinstance(base, str) else list(base)
        per_round = [
            t / min(self.times[b][i] for b in bases) for i, t in enumerate(self.times[name])
        ]
        return statistics.median(per_round)


# --- the floor: reading bytes once ----------------------------------------------------------


class ReadFloor:
    """Reads an array's bytes once, as fast as this machine can: the floor of any scan.

    The bytes are split into 4 MiB chunks claimed in order by `threads` threads (the same
    scheme as the store's scan), each folding its chunks with a vectorised reduction that
    releases the GIL. Two reductions are timed and the faster one per round is the floor.
    """

    CHUNK_BYTES = 4 * 1024 * 1024

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(max(threads - 1, 1)) if threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def reader(
        self, arrays: Sequence[npt.NDArray[np.generic]], reduce: Callable[..., object]
    ) -> Callable[[], None]:
        words = [a.reshape(-1).view(np.uint64) for a in arrays]
        step = self.CHUNK_BYTES // 8
        chunks = [w[i : i + step] for w in words for i in range(0, len(w), step)]

        def read() -> None:
            claims = iter(range(len(chunks)))
            lock = threading.Lock()

            def work() -> None:
                while True:
                    with lock:
                        number = next(claims, None)
                    if number is None:
                        return
                    reduce(chunks[number])

            if self._pool is None or len(chunks) == 1:
                work()
                return
            helpers = [self._pool.submit(work) for _ in range(self.threads - 1)]
            work()
            for helper in helpers:
                helper.result()

        return read

    def variants(self, arrays: Sequence[npt.NDArray[np.generic]]) -> dict[str, Callable[[], None]]:
        return {
            "floor: bitwise-or": self.reader(arrays, np.bitwise_or.reduce),
            "floor: max": self.reader(arrays, np.max),
        }


FLOORS = ("floor: bitwise-or", "floor: max")


# --- verdicts -------------------------------------------------------------------------------


@dataclass
class Verdicts:
    """Targets checked by one script; `exit_code` is 1 when any was missed."""

    lines: list[str] = field(default_factory=list)
    missed: int = 0

    def check(self, what: str, value: float, target: float, *, at_most: bool = True) -> bool:
        ok = value <= target if at_most else value >= target
        sign = "<=" if at_most else ">="
        self.lines.append(
            f"{'MET   ' if ok else 'MISSED'} {what}: {value:.3g} (target {sign} {target:.3g})"
        )
        self.missed += 0 if ok else 1
        return ok

    def note(self, line: str) -> None:
        self.lines.append(f"       {line}")

    def print(self) -> None:
        print("\ntargets:")
        for line in self.lines:
            print("  " + line)

    @property
    def exit_code(self) -> int:
        return 1 if self.missed else 0

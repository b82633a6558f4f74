"""Benchmark (not a test): exact vs HNSW search in the pgvector store, 10 % of sources authorized.

    python bench/pgvector_hnsw.py [--dsn DSN] [--passages 100000] [--queries 200]

Without `--dsn` (or `RETRIEVAL_HOST_BENCH_PG_DSN`) it starts a private PostgreSQL with pgvector
on loopback through `scripts/pg` (as root: the server runs as the `pgvec` user) and stops it at
the end. The data are synthetic clustered unit vectors, not embeddings of real text: HNSW recall
on uniform noise says nothing, and a real corpus of 100k passages would take an hour to embed
on this machine. Every query is filtered to the same random 10 % of the sources (the grant),
exactly as the host searches: the filter is applied in SQL before ranking.

Both paths run through `PgVectorStore.search` end to end (grant matching, ranking, re-scoring,
passage fetch). Recall@k compares the HNSW answer with the exact one. Exits 1 when the recall
is below `--min-recall` (0.98).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import CorpusDescriptor, EmbeddingDescriptor
from retrieval_host.core.models import Location
from retrieval_host.core.ports import CapacityLimits, StoredChunk, StoredSource

REPO = Path(__file__).resolve().parents[1]
CORPUS = "bench"
NAMESPACE = "ns"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with_cpuinfo = Path("/proc/cpuinfo")
    if with_cpuinfo.exists():
        for line in with_cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{cpu}; {os.cpu_count()} cores; {memory} memory; {platform.platform()}; "
        f"load average at start {load} (a shared machine: other work skews latencies)"
    )


@contextmanager
def database(dsn: str | None) -> Iterator[str]:
    """The given DSN, or a private server started (and stopped) through scripts/pg."""
    if dsn:
        yield dsn
        return
    script = REPO / "scripts" / "pg"
    subprocess.run([str(script), "install"], check=True, capture_output=True)
    root = Path(tempfile.mkdtemp(prefix="rh-bench-pg-", dir="/tmp"))
    root.chmod(0o711)  # the server user must traverse it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [str(script), "start", str(root / "data"), str(port)],
        check=True,
        capture_output=True,
        text=True,
    )
    try:
        yield done.stdout.strip()
    finally:
        subprocess.run([str(script), "stop", str(root / "data")], check=False)
        shutil.rmtree(root, ignore_errors=True)


def clustered(
    rng: np.random.Generator,
    centres: npt.NDArray[np.float64],
    projection: npt.NDArray[np.float64],
    n: int,
    spread: float,
    noise: float,
) -> npt.NDArray[np.float32]:
    """Points around cluster centres in a low-dimensional latent space, projected to the full
    dimension with a little isotropic noise, then normalised: like text embeddings, whose
    intrinsic dimension is far below their length (HNSW is built for that)."""
    latent = centres[rng.integers(0, len(centres), n)] + spread * rng.standard_normal(
        (n, centres.shape[1])
    )
    rows = latent @ projection + noise * rng.standard_normal((n, projection.shape[1]))
    unit: npt.NDArray[np.float32] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def descriptor(dims: int) -> CorpusDescriptor:
    embedding = EmbeddingDescriptor(
        provider_id="bench-synthetic",
        vendor="synthetic",
        account_id="none",
        auth_mode="none",
        model="clustered-unit",
        dimensions=dims,
    )
    return CorpusDescriptor(CORPUS, "bench-v1", embedding)


def load(store: PgVectorStore, vectors: npt.NDArray[np.float32], per_source: int) -> list[str]:
    limits = CapacityLimits(max_corpus_payload_bytes=16 * 1024**3)
    ids: list[str] = []
    for start in range(0, len(vectors), per_source):
        sid = f"s{start // per_source:06d}"
        rows = vectors[start : start + per_source]
        source = StoredSource(sid, "r1", sid, {}, "0" * 64, f"fp-{sid}", len(rows))
        chunks = [
            StoredChunk(f"{sid}:{i}", i, f"synthetic passage {i} of {sid}", Location(), row)
            for i, row in enumerate(rows)
        ]
        store.replace_source(
            CORPUS, NAMESPACE, source, chunks, expected_revision=None, limits=limits
        )
        ids.append(sid)
    return ids


def timed_searches(
    store: PgVectorStore, allowed: dict[str, str], queries: npt.NDArray[np.float32], k: int
) -> tuple[list[float], list[list[str]]]:
    for q in queries[:5]:  # warm caches and prepared statements
        store.search(CORPUS, NAMESPACE, allowed, q, k, CancelToken())
    latencies: list[float] = []
    answers: list[list[str]] = []
    for q in queries:
        start = time.perf_counter()
        hits = store.search(CORPUS, NAMESPACE, allowed, q, k, CancelToken())
        latencies.append((time.perf_counter() - start) * 1000)
        answers.append([h.chunk_id for h in hits])
    return latencies, answers


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("RETRIEVAL_HOST_BENCH_PG_DSN"))
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--per-source", type=int, default=10)
    parser.add_argument("--subset", type=float, default=0.10)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--latent", type=int, default=32)
    parser.add_argument("--spread", type=float, default=0.5)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--ef-search", type=int, default=100)
    parser.add_argument("--min-recall", type=float, default=0.98)
    parser.add_argument("--seed", type=int, default=20260101)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((args.clusters, args.latent))
    projection = rng.standard_normal((args.latent, args.dims)) / np.sqrt(args.latent)
    shape = (centres, projection)
    vectors = clustered(rng, *shape, args.passages, args.spread, args.noise)
    queries = clustered(rng, *shape, args.queries, args.spread, args.noise)
    schema = f"bench_{uuid.uuid4().hex[:12]}"

    print(f"machine: {machine()}")
    print(
        f"data: {args.passages} passages x {args.dims} dims, SYNTHETIC clustered unit vectors "
        f"({args.clusters} clusters in a {args.latent}-dim latent space, spread {args.spread}, "
        f"noise {args.noise}), {args.per_source} passages/source; "
        f"{args.queries} queries from the same distribution, k={args.k}"
    )
    with database(args.dsn) as dsn:
        with psycopg.connect(dsn) as conn:
            pg_version = conn.execute("SHOW server_version").fetchone()
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            pgv = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
        print(f"database: PostgreSQL {pg_version[0] if pg_version else '?'}, pgvector "
              f"{pgv[0] if pgv else '?'}")  # fmt: skip
        exact = PgVectorStore.open(dsn, schema=schema)
        hnsw: PgVectorStore | None = None
        try:
            exact.open_corpus(descriptor(args.dims))
            started = time.perf_counter()
            ids = load(exact, vectors, args.per_source)
            print(
                f"load: {len(ids)} sources through replace_source in "
                f"{time.perf_counter() - started:.1f} s"
            )
            granted = rng.choice(ids, size=max(1, round(len(ids) * args.subset)), replace=False)
            allowed = {str(sid): "r1" for sid in granted}
            rows = len(allowed) * args.per_source
            print(
                f"grant: {len(allowed)} of {len(ids)} sources ({args.subset:.0%}), {rows} passages"
            )

            started = time.perf_counter()
            hnsw = PgVectorStore.open(dsn, schema=schema, hnsw=True, ef_search=args.ef_search)
            hnsw.open_corpus(descriptor(args.dims))
            print(
                f"HNSW index build (m=16, ef_construction=64, CONCURRENTLY): "
                f"{time.perf_counter() - started:.1f} s"
            )

            exact_ms, truth = timed_searches(exact, allowed, queries, args.k)
            hnsw_ms, found = timed_searches(hnsw, allowed, queries, args.k)
            recall = sum(len(set(t) & set(f)) for t, f in zip(truth, found, strict=True)) / sum(
                len(t) for t in truth
            )

            # Sanity: the exact path equals brute force in NumPy for a few queries.
            index = {sid: i for i, sid in enumerate(ids)}
            mask = np.zeros(len(vectors), dtype=bool)
            for sid in allowed:
                start = index[sid] * args.per_source
                mask[start : start + args.per_source] = True
            rows_allowed = np.flatnonzero(mask)
            for q, answer in list(zip(queries, truth, strict=True))[:5]:
                best = rows_allowed[np.argsort(-(vectors[rows_allowed] @ q))[: args.k]]
                brute = [f"{ids[r // args.per_source]}:{r % args.per_source}" for r in best]
                if brute != answer:
                    print("error: the exact path disagrees with brute force", file=sys.stderr)
                    return 2

            stats = hnsw.search_stats
            print(
                f"exact : median {statistics.median(exact_ms):6.2f} ms, "
                f"p95 {percentile(exact_ms, 95):6.2f} ms"
            )
            print(
                f"HNSW  : median {statistics.median(hnsw_ms):6.2f} ms, "
                f"p95 {percentile(hnsw_ms, 95):6.2f} ms (ef_search={args.ef_search}, "
                f"iterative scan relaxed_order; index scans {stats.index_scans}, "
                f"exact fallbacks {stats.exact_fallbacks})"
            )
            print(f"recall@{args.k} of HNSW vs exact: {recall:.4f} (target >= {args.min_recall})")
        finally:
            exact.close()
            if hnsw is not None:
                hnsw.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )
    if recall < args.min_recall:
        print("FAIL: recall below target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (not a test): filtered search cost against the share of rows the grant allows.

    python bench/filtered.py [--rows 1000000] [--per-source 100] [--fractions 0.01 0.1 1]

A SQLite store holds `--rows` synthetic clustered unit vectors (384 dims) in sources of
`--per-source` passages. For each fraction a fixed random subset of the sources is allowed
(the grant the authorizer would return) and `SqliteVectorStore.search` (k=10, end to end) is
timed against the floor for that fraction: reading exactly the allowed rows' bytes once,
with as many threads as the store's scan may use. The store's grant cache is off here (it
would serve the repeated grant from a copy after the second search): this measures the scan;
`http_search.py` shows the cache at work. Each round runs every variant once in a
shuffled order; figures are medians over rounds.

Target (issue 8): cost proportional to the allowed fraction; at 1 % the search takes at most
3x the floor of reading 1 % of the rows plus 2 ms (checked at every fraction), and recall@10
against brute force over the allowed rows stays 1.0. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/filtered.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench._common import (
    FLOORS,
    Clusters,
    Matrix,
    ReadFloor,
    Rounds,
    Verdicts,
    exact_top,
    filled_store,
    private_directory,
    recall_at_k,
    search,
    stored_rows,
)
from bench._machine import describe, usable_cores
from retrieval_host.adapters.sqlite import SqliteVectorStore

FLOOR_FACTOR = 3.0
FIXED_MS = 2.0


@dataclass(frozen=True)
class FractionResult:
    fraction: float
    sources: int
    rows: int
    ours_ms: float
    floor_ms: float
    ratio: float
    recall: float

    @property
    def limit_ms(self) -> float:
        return FLOOR_FACTOR * self.floor_ms + FIXED_MS


@dataclass(frozen=True)
class FilteredResult:
    rows: int
    per_source: int
    build_s: float
    rounds: int
    fractions: list[FractionResult]

    def lines(self) -> list[str]:
        full = max(self.fractions, key=lambda f: f.fraction)
        out = [
            f"{self.rows:,} rows in sources of {self.per_source} (store filled in "
            f"{self.build_s:.1f} s), k=10, {self.rounds} rounds",
            "  allowed            rows   floor ms  search ms  x floor  limit ms  "
            "vs full scan  recall@10",
        ]
        for f in self.fractions:
            out.append(
                f"  {f.fraction:6.1%} {f.sources:7,} src {f.rows:9,} {f.floor_ms:9.3f} "
                f"{f.ours_ms:10.3f} {f.ratio:8.2f} {f.limit_ms:9.3f} "
                f"{f.ours_ms / full.ours_ms:12.4f}  {f.recall:9.3f}"
            )
        return out


def _ranges(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted source numbers as half-open ranges of consecutive ones (read as one block)."""
    ranges: list[tuple[int, int]] = []
    for n in numbers:
        if ranges and ranges[-1][1] == n:
            ranges[-1] = (ranges[-1][0], n + 1)
        else:
            ranges.append((n, n + 1))
    return ranges


def _searcher(
    store: SqliteVectorStore, allowed: dict[str, str], queries: Iterator[Matrix]
) -> Callable[[], object]:
    return lambda: search(store, allowed, next(queries))


def run_filtered(
    rows: int,
    *,
    per_source: int = 100,
    fractions: Sequence[float] = (0.01, 0.1, 1.0),
    rounds: int = 11,
    queries: int = 16,
    recall_queries: int = 8,
    clusters: Clusters | None = None,
) -> FilteredResult:
    """Fill a store with `rows` vectors; time searches allowed `fractions` of the sources."""
    shape = clusters or Clusters()
    vectors = shape.sample(rows, stream=0)
    probes = shape.sample(queries, stream=2)
    rng = np.random.default_rng(7)
    floor = ReadFloor(usable_cores())
    results: list[FractionResult] = []
    with private_directory("rh-bench-filtered-") as scratch:
        started = time.perf_counter()
        # The grant cache off: this measures the scan of a grant, not a cached copy of it.
        with filled_store(scratch, vectors, per_source, grant_cache_bytes=0) as (store, ids):
            build_s = time.perf_counter() - started
            grants: dict[float, list[int]] = {}
            for fraction in fractions:
                count = max(1, round(len(ids) * fraction))
                grants[fraction] = sorted(
                    int(i) for i in rng.choice(len(ids), count, replace=False)
                )
            variants: dict[str, Callable[[], object]] = {}
            stored = stored_rows(store, rows)  # the floor reads the store's own rows
            for fraction, numbers in grants.items():
                allowed = {ids[n]: "r1" for n in numbers}
                variants[f"ours {fraction}"] = _searcher(store, allowed, itertools.cycle(probes))
                blocks = [stored[a * per_source : b * per_source] for a, b in _ranges(numbers)]
                for name, read in floor.variants(blocks).items():
                    variants[f"{name} {fraction}"] = read
            timing = Rounds(variants).run(rounds)
            for fraction, numbers in grants.items():
                allowed = {ids[n]: "r1" for n in numbers}
                allowed_rows = np.concatenate(
                    [np.arange(n * per_source, min((n + 1) * per_source, rows)) for n in numbers]
                )
                recall = min(
                    recall_at_k(
                        (hit.chunk_id for hit in search(store, allowed, q)),
                        exact_top(vectors, allowed_rows, q, 10),
                        vectors,
                        q,
                        per_source,
                    )
                    for q in probes[:recall_queries]
                )
                floors = [f"{name} {fraction}" for name in FLOORS]
                results.append(
                    FractionResult(
                        fraction=fraction,
                        sources=len(numbers),
                        rows=len(allowed_rows),
                        ours_ms=timing.median_ms(f"ours {fraction}"),
                        floor_ms=min(timing.median_ms(name) for name in floors),
                        ratio=timing.ratio(f"ours {fraction}", floors),
                        recall=recall,
                    )
                )
    floor.close()
    return FilteredResult(rows, per_source, build_s, rounds, results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--per-source", type=int, default=100)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)

    print(describe())
    print(f"data: {Clusters().describe()}")
    print(f"scan threads: {usable_cores()}; the floor reads exactly the allowed rows once\n")
    result = run_filtered(
        args.rows, per_source=args.per_source, fractions=args.fractions, rounds=args.rounds
    )
    print("\n".join(result.lines()))
    verdicts = Verdicts()
    for f in result.fractions:
        verdicts.check(
            f"search with {f.fraction:.0%} allowed, ms (<= {FLOOR_FACTOR:g}x its floor "
            f"+ {FIXED_MS:g} ms)",
            f.ours_ms,
            f.limit_ms,
        )
        verdicts.check(f"recall@10 with {f.fraction:.0%} allowed", f.recall, 1.0, at_most=False)
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

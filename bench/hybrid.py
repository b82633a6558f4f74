"""Benchmark (not a test): hybrid search latency against dense-only, query embedding included.

    python bench/hybrid.py [--passages 100000] [--per-source 100] [--fraction 0.1]
                           [--rounds 5] [--queries 20]

A SQLite store holds `--passages` passages in sources of `--per-source`: SYNTHETIC clustered
384-dim vectors (embedding 100k passages takes about half an hour here) with real passage text
(SciFact abstracts split into passages, reused in order), so the lexical index (BM25 term
frequencies, written with the vectors) is a real one. One authorizer allows a fixed random
`--fraction` of the sources.

Searches go through `RetrievalService.search_context` in process, with the real local model
embedding each text query (SciFact's train claims): what a caller waits for, minus HTTP. Each
round runs every mode over the same `--queries` queries, the modes in a shuffled order;
`--rounds` rounds. The grant cache is on (the store's default): a repeated grant is scored
from its copy, in every mode alike. The query-vector cache is off: every search embeds.

Target (issue 15): hybrid time <= 1.3x dense-only time, the median of per-round ratios.
Exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/hybrid.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import CORPUS, REPO, Clusters, Rounds, Verdicts, fill, private_directory
from bench._machine import describe
from bench.memory import passages
from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.models import SearchMode, SearchRequest
from retrieval_host.core.ports import AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService

TARGET_RATIO = 1.3
MODES: tuple[SearchMode, ...] = ("dense", "hybrid", "lexical")
QUERIES = REPO.parent / "shared" / "data" / "scifact" / "queries.jsonl"
_FALLBACK_QUERIES = [
    "vitamin D deficiency and bone fractures",
    "statins lower cardiovascular risk",
    "gene expression in stem cells",
    "antibiotic resistance in hospitals",
]


@dataclass(frozen=True)
class HybridResult:
    passages: int
    allowed_sources: int
    queries: int
    median_ms: dict[str, float]  # per query, by mode
    ratio: float  # hybrid / dense, median of per-round ratios
    hits: dict[str, int]  # hits returned over one pass of the queries, by mode

    def lines(self) -> list[str]:
        out = [
            f"{self.passages:,} passages, {self.allowed_sources:,} sources allowed, "
            f"{self.queries} text queries per round"
        ]
        for mode in MODES:
            out.append(
                f"  {mode:8} {self.median_ms[mode]:8.2f} ms per query (median round), "
                f"{self.hits[mode]} hits per pass"
            )
        out.append(f"  hybrid / dense: {self.ratio:.3f} (median of per-round ratios)")
        return out


def text_queries(count: int) -> list[str]:
    """SciFact's claims in file order (a fixed fallback when the data set is absent)."""
    found: list[str] = []
    if QUERIES.exists():
        with QUERIES.open(encoding="utf-8") as lines:
            for line in lines:
                found.append(json.loads(line)["text"])
                if len(found) == count:
                    break
    while len(found) < count:
        found.append(_FALLBACK_QUERIES[len(found) % len(_FALLBACK_QUERIES)])
    return found


def run_hybrid(
    total: int,
    *,
    per_source: int = 100,
    fraction: float = 0.1,
    rounds: int = 5,
    queries: int = 20,
    clusters: Clusters | None = None,
    embedding: LocalEmbedding | None = None,
) -> HybridResult:
    clusters = clusters or Clusters()
    model = embedding or LocalEmbedding()
    texts, _ = passages(total)
    vectors = clusters.sample(total, stream=0)
    asked = text_queries(queries)
    with private_directory("rh-bench-hybrid-") as directory:
        store = SqliteVectorStore.open(directory / "store.sqlite")
        try:
            # The corpus names the local model: it embeds the queries (the stored vectors are
            # synthetic, which changes what is found, not what a scan costs).
            store.open_corpus(CorpusDescriptor(CORPUS, "bench-v1", model.descriptor))
            sources = fill(store, vectors, per_source, texts=texts)
            allowed_ids = random.Random(7).sample(sources, max(1, round(len(sources) * fraction)))
            grant = Grant("ns", dict.fromkeys(allowed_ids, "r1"))

            def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant:
                return grant

            # The query cache off: every search embeds its query, as the target says
            # (the rounds repeat the same queries, which the cache would answer).
            service = RetrievalService(
                [Corpus(CORPUS, "bench-v1", model, store, authorize)], query_cache_entries=0
            )
            context = RequestContext("bench")
            hits: dict[str, int] = {}

            def pass_of(mode: SearchMode) -> int:
                found = 0
                for query in asked:
                    result = service.search_context(
                        SearchRequest(CORPUS, query, limit=10, mode=mode), context
                    )
                    found += len(result.hits)
                return found

            for mode in MODES:
                hits[mode] = pass_of(mode)
            variants: dict[str, Callable[[], object]] = {
                mode: partial(pass_of, mode) for mode in MODES
            }
            timed = Rounds(variants).run(rounds)
        finally:
            store.close()
    return HybridResult(
        passages=total,
        allowed_sources=len(allowed_ids),
        queries=len(asked),
        median_ms={mode: timed.median_ms(mode) / len(asked) for mode in MODES},
        ratio=timed.ratio("hybrid", "dense"),
        hits=hits,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--per-source", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queries", type=int, default=20)
    args = parser.parse_args(argv)

    print(describe())
    print(f"data: {Clusters().describe()}, real SciFact passage text and text queries\n")
    result = run_hybrid(
        args.passages,
        per_source=args.per_source,
        fraction=args.fraction,
        rounds=args.rounds,
        queries=args.queries,
    )
    print("\n".join(result.lines()))
    verdicts = Verdicts()
    verdicts.check(
        f"hybrid / dense search time, {args.fraction:.0%} allowed, query embedding included",
        result.ratio,
        TARGET_RATIO,
    )
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

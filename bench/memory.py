"""Benchmark (not a test): resident memory of the SQLite store's in-memory index per passage.

    python bench/memory.py [--passages 100000] [--per-source 100]

A store is filled with `--passages` passages: real text (SciFact abstracts from
`../shared/data/scifact/corpus.jsonl`, split at sentence ends into passages of at most 1,000
characters and reused in order until there are enough; synthetic words when the file is
missing) with SYNTHETIC clustered 384-dim vectors (embedding 100k passages would take about 30
minutes). A fresh Python process then records its resident set (VmRSS), opens the store (which
loads every passage and vector into memory), runs one search, and records it again. The
difference is compared with the raw bytes: 4 bytes per vector dimension plus the UTF-8 text.

Targets: resident memory per 100k passages at most 1.3x the raw vector and text bytes (issue
8); with `--passages 1000000` or more, the first answer (open, load, one search) within 5 s
(issue 17, item 4). Exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/memory.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench._common import (
    CORPUS,
    NAMESPACE,
    REPO,
    Clusters,
    Verdicts,
    descriptor,
    fill,
    private_directory,
    source_id,
)
from bench._machine import describe

TARGET_RATIO = 1.3
SCIFACT = REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl"
MAX_PASSAGE_CHARS = 1000


def resident_bytes() -> int:
    """This process's resident set size (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _split(text: str) -> Iterator[str]:
    """Sentence-aligned pieces of at most MAX_PASSAGE_CHARS characters."""
    piece = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        if piece and len(piece) + 1 + len(sentence) > MAX_PASSAGE_CHARS:
            yield piece
            piece = ""
        piece = f"{piece} {sentence}" if piece else sentence
        while len(piece) > MAX_PASSAGE_CHARS:
            yield piece[:MAX_PASSAGE_CHARS]
            piece = piece[MAX_PASSAGE_CHARS:]
    if piece:
        yield piece


def passages(count: int, corpus: Path = SCIFACT) -> tuple[list[str], str]:
    """`count` passage texts and a description of where they came from."""
    pieces: list[str] = []
    if corpus.exists():
        with corpus.open(encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                pieces.extend(_split(f"{record.get('title', '')}. {record['text']}"))
        origin = (
            f"SciFact abstracts ({corpus.name}) split into <= {MAX_PASSAGE_CHARS}-char passages"
        )
    if not pieces:
        rng = np.random.default_rng(3)
        words = [f"w{n}" for n in range(5000)]
        pieces = [" ".join(rng.choice(words, 150)) for _ in range(1000)]
        origin = "synthetic words (SciFact not found)"
    # Each reuse is a new string object, as a store loading distinct passages would hold.
    texts = [pieces[i % len(pieces)] + ("" if i < len(pieces) else f" ({i})") for i in range(count)]
    reused = " (reused in order)" if count > len(pieces) else ""
    return texts, f"{origin}, {len(pieces):,} distinct{reused}"


@dataclass(frozen=True)
class MemoryResult:
    passages: int
    vector_bytes: int
    text_bytes: int
    baseline_rss: int
    loaded_rss: int
    load_s: float
    first_answer_s: float

    @property
    def raw_bytes(self) -> int:
        return self.vector_bytes + self.text_bytes

    @property
    def resident(self) -> int:
        return self.loaded_rss - self.baseline_rss

    @property
    def ratio(self) -> float:
        return self.resident / self.raw_bytes

    def lines(self) -> list[str]:
        per = 100_000 / self.passages
        mb = 1e6
        return [
            f"{self.passages:,} passages; store opened and loaded in {self.load_s:.1f} s, "
            f"first answer {self.first_answer_s:.1f} s after the open began",
            f"  raw bytes     {self.raw_bytes / mb:9.1f} MB  (vectors {self.vector_bytes / mb:.1f} "
            f"MB + UTF-8 text {self.text_bytes / mb:.1f} MB; {self.text_bytes / self.passages:.0f}"
            " B of text per passage)",
            f"  resident      {self.resident / mb:9.1f} MB  (VmRSS {self.baseline_rss / mb:.1f} -> "
            f"{self.loaded_rss / mb:.1f} MB)",
            f"  per 100k passages: {self.resident * per / mb:.1f} MB resident for "
            f"{self.raw_bytes * per / mb:.1f} MB raw = {self.ratio:.3f}x",
        ]


# Issue 17, item 4: at 1M passages the first answer within 5 s of opening the store.
COLD_START_PASSAGES = 1_000_000
TARGET_COLD_START_S = 5.0


def _child(path: Path, dims: int) -> None:
    """Runs in a fresh process: open the store, load it, report resident memory as JSON."""
    from retrieval_host.adapters.sqlite import SqliteVectorStore
    from retrieval_host.core.cancel import CancelToken

    gc.collect()
    before = resident_bytes()
    started = time.perf_counter()
    store = SqliteVectorStore.open(path)
    store.open_corpus(descriptor(dims))
    load_s = time.perf_counter() - started
    query = np.ones(dims, dtype=np.float32)
    store.search(CORPUS, NAMESPACE, {source_id(0): "r1"}, query, 10, CancelToken())
    first_answer_s = time.perf_counter() - started
    gc.collect()
    after = resident_bytes()
    report = {"before": before, "after": after, "load_s": load_s, "first": first_answer_s}
    print(json.dumps(report))
    store.close()


def measure_memory(
    count: int, *, per_source: int = 100, clusters: Clusters | None = None
) -> MemoryResult:
    """Fill a store with `count` passages, then measure a fresh process loading it."""
    shape = clusters or Clusters()
    texts, _ = passages(count)
    vectors = shape.sample(count, stream=3)
    with private_directory("rh-bench-memory-") as scratch:
        path = scratch / "store.sqlite"
        from retrieval_host.adapters.sqlite import SqliteVectorStore

        with SqliteVectorStore.open(path) as store:
            store.open_corpus(descriptor(shape.dims))
            fill(store, vectors, per_source, texts=texts)
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(path)],
            check=True,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(REPO)},
        )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return MemoryResult(
        passages=count,
        vector_bytes=vectors.nbytes,
        text_bytes=sum(len(t.encode("utf-8")) for t in texts),
        baseline_rss=int(report["before"]),
        loaded_rss=int(report["after"]),
        load_s=float(report["load_s"]),
        first_answer_s=float(report["first"]),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--per-source", type=int, default=100)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, Clusters().dims)
        return 0

    print(describe())
    _, origin = passages(args.passages)
    print(f"data: text from {origin}; vectors: {Clusters().describe()}\n")
    result = measure_memory(args.passages, per_source=args.per_source)
    print("\n".join(result.lines()))
    verdicts = Verdicts()
    verdicts.check("resident / raw vector+text bytes", result.ratio, TARGET_RATIO)
    if args.passages >= COLD_START_PASSAGES:
        verdicts.check(
            f"cold start at {args.passages:,} passages: first answer, s (issue 17 item 4)",
            result.first_answer_s,
            TARGET_COLD_START_S,
        )
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

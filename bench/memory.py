"""Benchmark (not a test): resident memory of the SQLite store's in-memory index per passage.

    python bench/memory.py [--passages 100000] [--per-source 100]

A store is filled with `--passages` passages: real text (SciFact abstracts from
`../shared/data/scifact/corpus.jsonl`, split at sentence ends into passages of at most 1,000
characters and reused in order until there are enough; synthetic words when the file is
missing) with SYNTHETIC clustered 384-dim vectors (embedding 100k passages would take about 30
minutes); the writer's close leaves the index snapshot beside the database. A fresh Python
process then records its memory, opens the store (which maps the snapshot), answers one search,
searches every passage (dense and lexical), and records its memory again: the growth of its
resident set (anonymous and file pages) is compared with the raw bytes, 4 bytes per vector
dimension plus the UTF-8 text. For reference (by default below 1M passages), the same with
snapshots off, the index read from SQLite. Then one and two such processes at once.

Targets: resident memory per 100k passages at most 1.3x the raw vector and text bytes (issue
8); with `--passages 1000000` or more (issue 17, item 4), the first answer (open, map, one
search) within 5 s, and a second process mapping the same store adding at most 15 % to the
memory of one (the sum of their proportional set sizes, each process having searched every
passage). Exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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
    return memory(os.getpid())["Rss"]


def memory(pid: int) -> dict[str, int]:
    """A process's resident (`Rss`: its anonymous and file pages) and proportional (`Pss`:
    each shared page divided between the processes mapping it) set sizes, in bytes, and the
    anonymous and file parts of `Rss`."""
    figures: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss", "Anonymous") and rest.strip().endswith("kB"):
            figures[name] = int(rest.split()[0]) * 1024
    figures["File"] = figures["Rss"] - figures["Anonymous"]
    return figures


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
class Opened:
    """What one fresh process measured opening the store and searching all of it."""

    open_s: float  # open and load (or map)
    first_answer_s: float  # from the open's start to the first search's answer
    baseline: dict[str, int]  # memory before the open
    loaded: dict[str, int]  # after the first answer and one search over every passage

    def grew(self, name: str) -> int:
        return self.loaded[name] - self.baseline[name]


@dataclass
class MemoryResult:
    passages: int
    vector_bytes: int
    text_bytes: int
    mapped: Opened  # the store opened from its snapshot (the default)
    from_sqlite: Opened | None  # the same store opened with snapshots off, for reference
    workers: dict[int, list[dict[str, int]]]  # processes at once -> each one's memory

    @property
    def raw_bytes(self) -> int:
        return self.vector_bytes + self.text_bytes

    @property
    def resident(self) -> int:
        return self.mapped.grew("Rss")

    @property
    def ratio(self) -> float:
        return self.resident / self.raw_bytes

    def worker_total(self, count: int) -> int:
        return sum(w["Pss"] for w in self.workers[count])

    @property
    def extra_worker(self) -> float:
        """What a second process adds to the memory of one (sum of proportional sets)."""
        return self.worker_total(2) / self.worker_total(1) - 1

    def lines(self) -> list[str]:
        per = 100_000 / self.passages
        mb = 1e6
        out = [
            f"{self.passages:,} passages",
            f"  raw bytes     {self.raw_bytes / mb:9.1f} MB  (vectors {self.vector_bytes / mb:.1f} "
            f"MB + UTF-8 text {self.text_bytes / mb:.1f} MB; {self.text_bytes / self.passages:.0f}"
            " B of text per passage)",
        ]
        for label, opened in (("snapshot mapped", self.mapped), ("from SQLite", self.from_sqlite)):
            if opened is None:
                continue
            out += [
                f"  {label + ':':17} opened in {opened.open_s:.2f} s, first answer "
                f"{opened.first_answer_s:.2f} s after the open began",
                "    after a search over every passage: resident "
                f"+{opened.grew('Rss') / mb:.1f} MB "
                f"(anonymous +{opened.grew('Anonymous') / mb:.1f}, file pages "
                f"+{opened.grew('File') / mb:.1f}) = {opened.grew('Rss') * per / mb:.1f} MB per "
                f"100k passages, {opened.grew('Rss') / self.raw_bytes:.3f}x raw",
            ]
        for count, processes in sorted(self.workers.items()):
            out.append(
                f"  {count} process(es) at once, each having searched every passage: "
                f"proportional sets {self.worker_total(count) / mb:.1f} MB in all ("
                + ", ".join(
                    f"Rss {w['Rss'] / mb:.0f} / Pss {w['Pss'] / mb:.0f} MB" for w in processes
                )
                + ")"
            )
        if 1 in self.workers and 2 in self.workers:
            out.append(f"  a second process adds {self.extra_worker:.1%} (sum of Pss, 2 vs 1)")
        return out


# Issue 17, item 4: at 1M passages the first answer within 5 s of opening the store, and each
# extra worker process adding at most 15 %.
COLD_START_PASSAGES = 1_000_000
TARGET_COLD_START_S = 5.0
TARGET_EXTRA_WORKER = 0.15


def _child(path: Path, dims: int, snapshots: bool, hold: bool) -> None:
    """Runs in a fresh process: open the store, answer one search, then search every passage
    (densely and lexically, touching every page of the index); report as JSON. With `hold`,
    stay alive (the parent measures) until stdin closes."""
    from retrieval_host.adapters.sqlite import SqliteVectorStore
    from retrieval_host.core.cancel import CancelToken
    from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms

    gc.collect()
    before = memory(os.getpid())
    started = time.perf_counter()
    # The exact scan: an approximate graph (built in the background after a search allowed
    # everything) is each process's own, and is measured in bench/README.md on its own.
    store = SqliteVectorStore.open(path, snapshots=snapshots, approximate_min_rows=0)
    store.open_corpus(descriptor(dims))
    open_s = time.perf_counter() - started
    query = np.ones(dims, dtype=np.float32)
    store.search(CORPUS, NAMESPACE, {source_id(0): "r1"}, query, 10, CancelToken())
    first_answer_s = time.perf_counter() - started
    every = store.current_revisions(CORPUS, NAMESPACE)
    store.search(CORPUS, NAMESPACE, every, query, 10, CancelToken())
    terms = query_terms(
        "the cells of the immune system express protein in patients with cancer", DEFAULT_ANALYZER
    )
    store.lexical_search(CORPUS, NAMESPACE, every, terms, 10, CancelToken())
    gc.collect()
    report = {
        "open_s": open_s,
        "first": first_answer_s,
        "before": before,
        "after": memory(os.getpid()),
    }
    print(json.dumps(report), flush=True)
    if hold:
        sys.stdin.read()
    store.close()


def _run_child(path: Path, snapshots: bool = True) -> Opened:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(path)]
        + ([] if snapshots else ["--no-snapshots"]),
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return Opened(report["open_s"], report["first"], report["before"], report["after"])


def _workers(path: Path, count: int) -> list[dict[str, int]]:
    """`count` processes mapping the store at once, each having searched all of it: the
    memory of each, read while all are alive."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), "--hold"]
    children = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(REPO)},
        )
        for _ in range(count)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            json.loads(child.stdout.readline())  # ready: opened and searched everything
        return [memory(child.pid) for child in children]
    finally:
        for child in children:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.close()
            child.wait()
            child.stdout.close()


def measure_memory(
    count: int,
    *,
    per_source: int = 100,
    clusters: Clusters | None = None,
    sqlite_reference: bool = True,
    workers: bool = True,
) -> MemoryResult:
    """Fill a store with `count` passages (its close writes the index snapshot), then measure
    fresh processes opening it."""
    shape = clusters or Clusters()
    texts, _ = passages(count)
    vectors = shape.sample(count, stream=3)
    with private_directory("rh-bench-memory-") as scratch:
        path = scratch / "store.sqlite"
        from retrieval_host.adapters.sqlite import SqliteVectorStore

        with SqliteVectorStore.open(path) as store:
            store.open_corpus(descriptor(shape.dims))
            fill(store, vectors, per_source, texts=texts)
        mapped = _run_child(path)
        from_sqlite = _run_child(path, snapshots=False) if sqlite_reference else None
        processes = {n: _workers(path, n) for n in (1, 2)} if workers else {}
    return MemoryResult(
        passages=count,
        vector_bytes=vectors.nbytes,
        text_bytes=sum(len(t.encode("utf-8")) for t in texts),
        mapped=mapped,
        from_sqlite=from_sqlite,
        workers=processes,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--per-source", type=int, default=100)
    parser.add_argument(
        "--sqlite-reference",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also open the store from SQLite with snapshots off (default: below 1M passages)",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--no-snapshots", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, Clusters().dims, not args.no_snapshots, args.hold)
        return 0

    print(describe())
    _, origin = passages(args.passages)
    print(f"data: text from {origin}; vectors: {Clusters().describe()}\n")
    reference = args.sqlite_reference
    if reference is None:
        reference = args.passages < COLD_START_PASSAGES
    result = measure_memory(args.passages, per_source=args.per_source, sqlite_reference=reference)
    print("\n".join(result.lines()))
    verdicts = Verdicts()
    verdicts.check("resident / raw vector+text bytes", result.ratio, TARGET_RATIO)
    if args.passages >= COLD_START_PASSAGES:
        verdicts.check(
            f"a second worker process at {args.passages:,} passages, share of one's memory "
            "(issue 17 item 4)",
            result.extra_worker,
            TARGET_EXTRA_WORKER,
        )
        verdicts.check(
            f"cold start at {args.passages:,} passages: first answer, s (issue 17 item 4)",
            result.mapped.first_answer_s,
            TARGET_COLD_START_S,
        )
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

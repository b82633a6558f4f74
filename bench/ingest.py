"""Benchmark (not a test): end-to-end ingestion of SciFact vs embedding the same passages.

    python bench/ingest.py [--docs 500] [--rounds 3] [--threads 2] [--corpus PATH]

Each SciFact abstract (`../shared/data/scifact/corpus.jsonl`) becomes one Markdown file
(`# title`, blank line, abstract). The end-to-end path is what `retrieval-host ingest` runs:
`ingest_paths` over the files (per file: read, parse, chunk with the model's tokenizer, the
application's authorizer, embed with the local model, one atomic SQLite commit, an fsync'ed
journal line) into a fresh SQLite store. The baseline embeds exactly the passages that run
produced (read back from the store), with the same `LocalEmbedding` adapter and threads, in
one call: the raw embedding time. Rounds alternate the two (order shuffled); the overhead is
the median over rounds of ingest time / embedding time - 1.

The documents are the first `--docs` of the file, in file order (a deterministic subset: the
whole corpus, 5,183 abstracts, takes several minutes per round on two cores; `--docs 0` runs
all of it).

Target (issue 8): overhead at most 10 %; passages/s are reported. Exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/ingest.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import apsw

from bench._common import REPO, Verdicts, private_directory
from bench._machine import describe, usable_cores
from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.batch import ingest_paths
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings

SCIFACT = REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl"
TARGET_OVERHEAD = 0.10
CORPUS = "scifact"


def write_documents(corpus: Path, directory: Path, limit: int) -> list[Path]:
    """The first `limit` abstracts (all when 0) as Markdown files, in file order."""
    paths: list[Path] = []
    with corpus.open(encoding="utf-8") as lines:
        for line in lines:
            if limit and len(paths) >= limit:
                break
            record = json.loads(line)
            path = directory / f"{record['_id']}.md"
            title = " ".join(str(record.get("title") or record["_id"]).split())
            path.write_text(f"# {title}\n\n{record['text'].strip()}\n", encoding="utf-8")
            paths.append(path)
    return paths


def _index_anything(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    # The benchmark application lets its one subject write any source at any revision.
    if request.operation != "index":
        return None
    return Grant("ns", {sid: ANY_REVISION for sid in request.source_ids or ()})


@dataclass(frozen=True)
class IngestRound:
    ingest_s: float
    embed_s: float
    passages: int
    files: int

    @property
    def overhead(self) -> float:
        return self.ingest_s / self.embed_s - 1


def ingest_once(
    paths: Sequence[Path], root: Path, embedding: LocalEmbedding, scratch: Path
) -> tuple[float, list[str]]:
    """Ingest the files into a fresh store; (seconds, the passage texts it stored)."""
    store_path = scratch / "store.sqlite"
    store = SqliteVectorStore.open(store_path)
    try:
        corpus = Corpus(
            id=CORPUS,
            version="bench-v1",
            embedding=embedding,
            store=store,
            authorize=_index_anything,
            chunking=ChunkingSettings().as_identity(),
        )
        driver = Driver(RetrievalService([corpus]))
        started = time.perf_counter()
        report = ingest_paths(
            driver,
            CORPUS,
            paths,
            RequestContext(subject="bench"),
            journal_path=scratch / "journal.jsonl",
            root=root,
        )
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    if report.count("indexed") != len(paths):
        failed = [i for i in report.items if i.status != "indexed"][:3]
        raise RuntimeError(f"ingest did not index every file: {failed}")
    reader = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        texts = [str(r[0]) for r in reader.execute("SELECT text FROM chunks ORDER BY rowid")]
    finally:
        reader.close()
    return elapsed, texts


def run_ingest(
    *, docs: int, rounds: int, threads: int, corpus: Path = SCIFACT
) -> list[IngestRound]:
    """Alternate end-to-end ingestion and raw embedding of the same passages, `rounds` times."""
    embedding = LocalEmbedding(threads=threads)
    order = random.Random(3)
    results: list[IngestRound] = []
    with private_directory("rh-bench-ingest-") as work:
        documents = work / "docs"
        documents.mkdir()
        paths = write_documents(corpus, documents, docs)
        embedding.embed(["warm up the model"], CancelToken())
        texts: list[str] = []
        for number in range(rounds):
            scratch = work / f"round-{number}"
            scratch.mkdir(mode=0o700)
            steps = ["ingest", "embed"] if texts else ["ingest"]
            order.shuffle(steps)
            ingest_s = embed_s = 0.0
            for step in steps:
                if step == "ingest":
                    ingest_s, texts = ingest_once(paths, documents, embedding, scratch)
                else:
                    embed_s = _embed(embedding, texts)
            if "embed" not in steps:  # the first round learns the passages by ingesting
                embed_s = _embed(embedding, texts)
            results.append(IngestRound(ingest_s, embed_s, len(texts), len(paths)))
            print(
                f"  round {number + 1}: ingest {ingest_s:7.2f} s, embed {embed_s:7.2f} s, "
                f"overhead {results[-1].overhead:+.1%}",
                flush=True,
            )
    return results


def _embed(embedding: LocalEmbedding, texts: Sequence[str]) -> float:
    started = time.perf_counter()
    embedding.embed(texts, CancelToken())
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=500, help="first N abstracts; 0 = all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--corpus", type=Path, default=SCIFACT)
    args = parser.parse_args(argv)

    print(describe())
    print(
        f"data: {'all' if not args.docs else f'the first {args.docs:,}'} SciFact abstracts of "
        f"{args.corpus} (file order), one Markdown file each; local model all-MiniLM-L6-v2 "
        f"int8, {args.threads} threads, real embeddings\n"
    )
    rounds = run_ingest(
        docs=args.docs, rounds=args.rounds, threads=args.threads, corpus=args.corpus
    )
    last = rounds[-1]
    overhead = statistics.median(r.overhead for r in rounds)
    ingest_s = statistics.median(r.ingest_s for r in rounds)
    embed_s = statistics.median(r.embed_s for r in rounds)
    print(
        f"\n{last.files:,} files -> {last.passages:,} passages\n"
        f"  end-to-end ingest  {ingest_s:8.2f} s  {last.passages / ingest_s:7.1f} passages/s "
        f"({last.files / ingest_s:.1f} files/s)\n"
        f"  raw embedding      {embed_s:8.2f} s  {last.passages / embed_s:7.1f} passages/s\n"
        f"  overhead (median of per-round ratios): {overhead:+.1%}"
    )
    verdicts = Verdicts()
    verdicts.check("ingest overhead over raw embedding", overhead, TARGET_OVERHEAD)
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

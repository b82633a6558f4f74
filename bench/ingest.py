"""Benchmark (not a test): end-to-end ingestion of SciFact vs the model driven directly.

    python bench/ingest.py [--docs 500] [--rounds 3] [--threads N] [--rss-docs 2800]
                           [--corpus PATH]

Issue 17, item 2. Each SciFact abstract (`../shared/data/scifact/corpus.jsonl`) becomes one
Markdown file (`# title`, blank line, abstract); the first `--docs` of the file, in file order.

- **Ours, end to end:** what `retrieval-host ingest` runs: `ingest_paths` over the files
  (several in flight; per file: read, parse in a parse worker, chunk with the model's tokenizer,
  the application's authorizer, embed with `LocalEmbedding(threads=N)`, one atomic SQLite commit
  and an fsync'ed journal line) into a fresh SQLite store.
- **Direct onnxruntime:** the same pinned model file and tokenizer driven with nothing around
  them, over exactly the texts the ingest embedded (each passage with its context line,
  recorded on the way): tokenized once, sorted by token count, cut into batches, run by
  1..N one-thread sessions in parallel threads, mean-pooled and normalized. A sweep over
  sessions x batch size (also with a token budget per batch, as the adapter cuts them, and
  one session of N intra-op threads, the adapter's old shape), with onnxruntime's default
  graph optimizations and, for the fastest shapes, with the basic ones the adapter uses,
  on 192 of the texts picks the two fastest; each round runs both on every text and the
  faster is that round's best. The target is ours >= 0.9x that best (median of per-round
  ratios), and every vector the ingest stored within cosine 0.99999 of the direct one.
  Each round also runs the fastest shape on the graph the adapter runs (the file's attention
  NaN guards removed at load, `adapters/onnx_graph.py`: the same vectors bit for bit, less
  model time), printed beside the target as what the host's own work costs: ours against
  the model as the host runs it.
- **Memory:** a child process ingests the first `--rss-docs` abstracts (at least 5,000
  passages) the same way and reports its peak RSS (VmHWM) and its RSS once idle after the
  ingest (store open, model loaded). Targets: peak <= 600 MB; idle <= 400 MB + 1.3x the data
  (vectors at 4 bytes per dimension plus UTF-8 passage text).

Rounds interleave ours and the direct runs in a shuffled order, and each also counts the CPU it
took, per passage: the best direct shape's (the model alone), and ours in its own process and in
other processes (the parse workers; /proc/stat counts every process on the machine), with the
share of the machine's cores that were busy: whether ours falls short for idle cores or for
work beside the model. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/ingest.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from bench._common import REPO, Verdicts, private_directory
from bench._machine import CpuMeter, CpuUse, describe, usable_cores
from retrieval_host.adapters.embedding_local import (
    MAX_TOKENS,
    LocalEmbedding,
    TokenizerRecipe,
    pinned_model_path,
    pinned_tokenizer_path,
)
from retrieval_host.adapters.onnx_graph import without_nan_guards
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.batch import ingest_paths
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, EmbeddingBatch, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings

SCIFACT = REPO.parent / "shared" / "data" / "scifact" / "corpus.jsonl"
TARGET_RATIO = 0.9
ADAPTER_GRAPH = "the adapter's graph"
TARGET_COSINE = 0.99999
TARGET_PEAK_MB = 600.0
TARGET_IDLE_BASE_MB = 400.0
TARGET_IDLE_FACTOR = 1.3
RSS_MIN_PASSAGES = 5000
SWEEP_TEXTS = 192
CORPUS = "scifact"


GRAPH_LEVELS = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
}


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


class Recording:
    """`LocalEmbedding` as the ingest sees it, remembering each text it embedded and its
    vector (a dict store per call: nothing measurable beside a model run)."""

    def __init__(self, inner: LocalEmbedding) -> None:
        self.inner = inner
        self.vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self.inner.descriptor

    @property
    def max_input_tokens(self) -> int:
        return self.inner.max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def portable_token_counter(self) -> TokenizerRecipe:
        return self.inner.portable_token_counter()

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        batch = self.inner.embed(texts, cancel)
        with self._lock:
            self.vectors.update(zip(texts, batch.vectors, strict=True))
        return batch


@contextmanager
def ingested(
    paths: Sequence[Path], root: Path, embedding: LocalEmbedding | Recording, scratch: Path
) -> Iterator[tuple[float, int]]:
    """Ingest the files into a fresh store; (seconds, passages stored), the store still open."""
    store = SqliteVectorStore.open(scratch / "store.sqlite")
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
        if report.count("indexed") != len(paths):
            failed = [i for i in report.items if i.status != "indexed"][:3]
            raise RuntimeError(f"ingest did not index every file: {failed}")
        yield elapsed, sum(item.chunk_count or 0 for item in report.items)
    finally:
        store.close()


def ingest_once(
    paths: Sequence[Path], root: Path, embedding: LocalEmbedding | Recording, scratch: Path
) -> tuple[float, int]:
    """Ingest the files into a fresh store; (seconds, passages stored)."""
    with ingested(paths, root, embedding, scratch) as result:
        return result


@dataclass(frozen=True)
class Shape:
    """How the direct run drives the model: sessions in parallel, threads each, batch size."""

    sessions: int
    threads: int
    batch: int
    tokens: int = 0  # > 0: a batch also holds at most this many tokens once padded
    graph: str = "all"  # onnxruntime's graph optimizations: "all" (its default) or "basic"
    unguarded: bool = False  # the graph the adapter runs: the attention's NaN guards removed

    def __str__(self) -> str:
        budget = f" <= {self.tokens} tokens" if self.tokens else ""
        rewrite = ", NaN guards removed" if self.unguarded else ""
        return (
            f"{self.sessions} session(s) x {self.threads} thread(s), "
            f"batches of {self.batch}{budget}, {self.graph} graph optimizations{rewrite}"
        )


class Direct:
    """The pinned model file and tokenizer driven by onnxruntime, nothing else."""

    def __init__(self, shape: Shape) -> None:
        sessions, threads = shape.sessions, shape.threads
        model = pinned_model_path().read_bytes()
        if shape.unguarded:
            model, _ = without_nan_guards(model)
        self.tokenizer = Tokenizer.from_file(str(pinned_tokenizer_path()))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = GRAPH_LEVELS[shape.graph]
        self.sessions = [
            ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
            for _ in range(sessions)
        ]

    def embed(self, texts: Sequence[str], batch: int, tokens: int = 0) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        cut: list[list[int]] = []
        for i in order:
            last = cut[-1] if cut else []
            width = len(encodings[i].ids)
            if 0 < len(last) < batch and (not tokens or (len(last) + 1) * width <= tokens):
                last.append(i)
            else:
                cut.append([i])
        batches = iter(cut)
        lock = threading.Lock()
        out = np.empty((len(texts), 384), dtype=np.float32)

        def lane(session: ort.InferenceSession) -> None:
            while True:
                with lock:
                    idx = next(batches, None)
                if idx is None:
                    return
                width = max(len(encodings[i].ids) for i in idx)
                ids = np.zeros((len(idx), width), dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for row, i in enumerate(idx):
                    ids[row, : len(encodings[i].ids)] = encodings[i].ids
                    mask[row, : len(encodings[i].ids)] = 1
                (hidden,) = session.run(
                    ["last_hidden_state"],
                    {"input_ids": ids, "attention_mask": mask, "token_type_ids": ids * 0},
                )
                weights = mask[:, :, None].astype(np.float32)
                pooled = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
                out[idx] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

        threads = [threading.Thread(target=lane, args=(s,)) for s in self.sessions[1:]]
        for thread in threads:
            thread.start()
        lane(self.sessions[0])
        for thread in threads:
            thread.join()
        return out


def sweep(texts: Sequence[str], cores: int) -> list[tuple[float, Shape]]:
    """Passages/s of each shape on `texts` (best of two), fastest first."""
    shapes = [Shape(s, 1, b) for s in sorted({1, cores}) for b in (1, 4, 8, 16, 32)]
    shapes += [Shape(cores, 1, 32, t) for t in (128, 256, 512)]
    if cores > 1:
        shapes += [Shape(1, cores, 1), Shape(1, cores, 32)]  # one run of every core
    # The adapter's graph optimizations (basic), on the shapes that were fastest with the default.
    shapes += [Shape(s, 1, b, graph="basic") for s in sorted({1, cores}) for b in (1, 4, 8)]
    shapes += [Shape(cores, 1, 32, 256, graph="basic")]
    found: list[tuple[float, Shape]] = []
    for shape in shapes:
        direct = Direct(shape)
        direct.embed(texts[:8], shape.batch, shape.tokens)  # warm up
        best = 0.0
        for _ in range(2):
            started = time.perf_counter()
            direct.embed(texts, shape.batch, shape.tokens)
            best = max(best, len(texts) / (time.perf_counter() - started))
        found.append((best, shape))
        print(f"  sweep: {shape!s:<46} {best:7.1f} passages/s", flush=True)
    return sorted(found, key=lambda f: -f[0])


@dataclass(frozen=True)
class Round:
    ours: float  # passages/s, end to end
    direct: dict[str, float]  # passages/s of each finalist shape
    ours_cpu: CpuUse
    direct_cpu: dict[str, CpuUse]
    adapter_graph: float  # passages/s of the fastest shape on the adapter's graph (no target)

    @property
    def best(self) -> float:
        return max(self.direct.values())

    @property
    def ratio(self) -> float:
        return self.ours / self.best

    @property
    def best_cpu(self) -> CpuUse:
        return self.direct_cpu[max(self.direct, key=lambda shape: self.direct[shape])]


def run(
    *, docs: int, rounds: int, threads: int, corpus: Path = SCIFACT
) -> tuple[list[Round], float, int, int]:
    """The rounds, the lowest cosine between stored and direct vectors, files, passages."""
    embedding = LocalEmbedding(threads=threads)
    recording = Recording(embedding)
    order = random.Random(3)
    with private_directory("rh-bench-ingest-") as work:
        documents = work / "docs"
        documents.mkdir()
        paths = write_documents(corpus, documents, docs)
        embedding.embed(["warm up the model"], CancelToken())
        # A first ingest learns the texts embedded (each passage with its context line).
        scratch = work / "learn"
        scratch.mkdir(mode=0o700)
        _, passages = ingest_once(paths, documents, recording, scratch)
        texts = sorted(recording.vectors)  # distinct texts; any fixed order
        random.Random(5).shuffle(texts)
        print(f"{len(paths):,} files -> {passages:,} passages ({len(texts):,} distinct texts)")
        print(f"direct onnxruntime sweep on {min(SWEEP_TEXTS, len(texts))} texts:")
        finalists = [shape for _, shape in sweep(texts[:SWEEP_TEXTS], threads)[:2]]
        directs = {str(s): (Direct(s), s) for s in finalists}
        reference = directs[str(finalists[0])]
        as_run = replace(finalists[0], unguarded=True)
        directs[ADAPTER_GRAPH] = (Direct(as_run), as_run)
        print(f"  and on the adapter's graph: {as_run}")
        stored = np.stack([recording.vectors[t] for t in texts])
        direct_vectors = reference[0].embed(texts, reference[1].batch, reference[1].tokens)
        low = float(np.min(np.sum(stored * direct_vectors, axis=1)))
        results: list[Round] = []
        for number in range(rounds):
            steps = ["ours", *directs]
            order.shuffle(steps)
            ours = 0.0
            direct: dict[str, float] = {}
            cpu: dict[str, CpuUse] = {}
            for step in steps:
                meter = CpuMeter()
                if step == "ours":
                    scratch = work / f"round-{number}"
                    scratch.mkdir(mode=0o700)
                    seconds, stored_passages = ingest_once(paths, documents, embedding, scratch)
                    ours = stored_passages / seconds
                else:
                    model, shape = directs[step]
                    started = time.perf_counter()
                    model.embed(texts, shape.batch, shape.tokens)
                    direct[step] = len(texts) / (time.perf_counter() - started)
                cpu[step] = meter.stop()
            ours_cpu = cpu.pop("ours")
            adapter_graph = direct.pop(ADAPTER_GRAPH)
            cpu.pop(ADAPTER_GRAPH)
            results.append(Round(ours, direct, ours_cpu, cpu, adapter_graph))
            print(
                f"  round {number + 1}: ours {ours:6.1f} passages/s, direct "
                + ", ".join(f"{v:6.1f}" for v in direct.values())
                + f" -> {results[-1].ratio:.3f}x the best; adapter's graph {adapter_graph:6.1f}",
                flush=True,
            )
    return results, low, len(paths), passages


def _cpu_lines(rounds: Sequence[Round], passages: int) -> str:
    """Where the cores went, per passage (medians of the rounds): the model alone against
    everything ours runs, in its process and in others (the parse workers)."""

    def ms(values: Iterator[float]) -> float:
        return statistics.median(values) * 1000 / passages

    direct = ms(r.best_cpu.process for r in rounds)
    process = ms(r.ours_cpu.process for r in rounds)
    others = ms(r.ours_cpu.others for r in rounds)
    busy = statistics.median(r.ours_cpu.busy for r in rounds)
    return (
        f"  CPU per passage (median): best direct {direct:.1f} ms; ours {process:.1f} ms in its "
        f"process + {others:.1f} ms in others (parse workers, and anything else on the machine), "
        f"the machine's cores {busy:.0%} busy"
    )


def _status_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_child(docs: int, threads: int, corpus: Path) -> dict[str, float]:
    """In this (fresh) process: ingest `docs` abstracts, then report peak and idle RSS."""
    embedding = LocalEmbedding(threads=threads)
    with private_directory("rh-bench-ingest-rss-") as work:
        documents = work / "docs"
        documents.mkdir()
        paths = write_documents(corpus, documents, docs)
        with ingested(paths, documents, embedding, work) as (seconds, passages):
            idle = _status_mb("VmRSS")  # the store still open, the model loaded
            peak = _status_mb("VmHWM")
        text_bytes = sum(len(p.read_text(encoding="utf-8").encode("utf-8")) for p in paths)
    return {
        "passages": passages,
        "seconds": seconds,
        "peak_mb": peak,
        "idle_mb": idle,
        "data_mb": (passages * 384 * 4 + text_bytes) / 2**20,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=500, help="first N abstracts; 0 = all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--rss-docs", type=int, default=2800, help="0 skips the memory run")
    parser.add_argument("--corpus", type=Path, default=SCIFACT)
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_docs, args.threads, args.corpus)))
        return 0

    print(describe())
    print(
        f"data: {'all' if not args.docs else f'the first {args.docs:,}'} SciFact abstracts of "
        f"{args.corpus} (file order), one Markdown file each; local model all-MiniLM-L6-v2 "
        f"int8, LocalEmbedding(threads={args.threads}), real embeddings\n"
    )
    rounds, low, files, passages = run(
        docs=args.docs, rounds=args.rounds, threads=args.threads, corpus=args.corpus
    )
    ratio = statistics.median(r.ratio for r in rounds)
    ours = statistics.median(r.ours for r in rounds)
    best = statistics.median(r.best for r in rounds)
    as_run = statistics.median(r.adapter_graph for r in rounds)
    host = statistics.median(r.ours / r.adapter_graph for r in rounds)
    print(
        f"\n{files:,} files -> {passages:,} passages\n"
        f"  end-to-end ingest        {ours:7.1f} passages/s (median)\n"
        f"  best direct onnxruntime  {best:7.1f} passages/s (median; the model file as shipped)\n"
        f"  ours / best direct (median of per-round ratios): {ratio:.3f}\n"
        f"  direct, the adapter's graph {as_run:7.1f} passages/s (median; NaN guards removed)\n"
        f"  ours / direct on the adapter's graph (median of per-round ratios): {host:.3f}\n"
        f"  lowest cosine, stored vs direct vectors: {low:.7f}"
    )
    print(_cpu_lines(rounds, passages))
    verdicts = Verdicts()
    verdicts.check(
        "end-to-end ingest / best direct onnxruntime", ratio, TARGET_RATIO, at_most=False
    )
    verdicts.check("lowest cosine, stored vs direct", low, TARGET_COSINE, at_most=False)
    if args.rss_docs:
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--rss-child",
             "--rss-docs", str(args.rss_docs), "--threads", str(args.threads),
             "--corpus", str(args.corpus)],
            check=True, capture_output=True, text=True, env=dict(os.environ),
        )  # fmt: skip
        memory = json.loads(child.stdout.strip().splitlines()[-1])
        limit = TARGET_IDLE_BASE_MB + TARGET_IDLE_FACTOR * memory["data_mb"]
        print(
            f"\nmemory: a fresh process ingesting the first {args.rss_docs:,} abstracts "
            f"({int(memory['passages']):,} passages in {memory['seconds']:.0f} s)\n"
            f"  peak RSS (VmHWM)       {memory['peak_mb']:7.1f} MiB\n"
            f"  idle RSS after ingest  {memory['idle_mb']:7.1f} MiB (store open, model loaded)\n"
            f"  data                   {memory['data_mb']:7.1f} MiB (vectors + UTF-8 text)"
        )
        verdicts.check(
            f"passages in the memory run (>= {RSS_MIN_PASSAGES:,})",
            memory["passages"],
            RSS_MIN_PASSAGES,
            at_most=False,
        )
        verdicts.check("peak RSS of the batch ingest, MiB", memory["peak_mb"], TARGET_PEAK_MB)
        verdicts.check("idle RSS after the ingest, MiB (400 + 1.3x data)", memory["idle_mb"], limit)
    verdicts.print()
    return verdicts.exit_code


if __name__ == "__main__":
    sys.exit(main())

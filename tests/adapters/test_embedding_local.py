"""LocalEmbedding: golden vectors, 256-token truncation, untruncated counts, pinned digests.

The golden vectors in golden_vectors.json were computed by this module's `write_golden()`
(`python -m tests.adapters.test_embedding_local` from the repository root). Regenerate them only on
a deliberate change of weights or tokenizer, and say so in the commit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from retrieval_host.adapters import embedding_local
from retrieval_host.adapters.embedding_local import (
    DIMENSIONS,
    LARGE_CALL_TOKENS,
    MAX_TOKENS,
    MODEL_NAME,
    MODEL_SHA256,
    TOKENIZER_SHA256,
    LocalEmbedding,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError

GOLDEN_FILE = Path(__file__).with_name("golden_vectors.json")

GOLDEN_TEXTS = {
    "short": "The quick brown fox jumps over the lazy dog.",
    "paragraph": (
        "Retrieval systems split long documents into passages, embed each passage as a vector, "
        "and store those vectors alongside the original text and its location. When a question "
        "arrives, it is embedded with the same model, and the passages whose vectors lie "
        "closest to it are returned as evidence. The quality of the answer depends on how well "
        "the model captures meaning, how the text was divided, and whether the application "
        "only shows passages the reader is allowed to see. Citations let a reader verify every "
        "claim against the exact passage it came from, page and line included, before trusting "
        "the generated answer."
    ),
    "non_ascii": (
        "Crème brûlée à la façon de Zoë, naïve Ñandú señor — 東京の夜景はとても美しいです。"
        " 北京欢迎你！Größenverhältnisse über Ærøskøbing."
    ),
}

COOKING = (
    "To make a simple tomato sauce, warm olive oil in a heavy pan over medium heat, add sliced "
    "garlic and cook it gently until fragrant but not brown. Pour in crushed tomatoes, season "
    "with salt, a pinch of sugar and black pepper, then let the sauce simmer slowly for twenty "
    "minutes, stirring now and then so that it does not stick to the bottom of the pan. Tear "
    "fresh basil leaves over the top, stir in a knob of butter for a glossy finish, and taste "
    "again before serving it over freshly boiled pasta with grated parmesan cheese on the side, "
    "along with a green salad dressed in lemon juice and good oil."
)
ASTRONOMY = (
    "Neutron stars are the collapsed cores of massive stars, so dense that a teaspoon of their "
    "matter would weigh billions of tonnes, and pulsars sweep beams of radio waves across the "
    "galaxy as they spin hundreds of times every second."
)


@pytest.fixture
def truncating_tokenizer() -> Tokenizer:
    """The shipped tokenizer as it is configured on disk: it cuts at 128 tokens."""
    return Tokenizer.from_file(str(embedding_local.pinned_tokenizer_path()))


def embed(adapter: LocalEmbedding, *texts: str) -> npt.NDArray[np.float32]:
    return adapter.embed(list(texts), CancelToken()).vectors


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def prefix_of(text: str, tokenizer: Tokenizer, tokens: int) -> str:
    """The text covered by the first `tokens` tokens ([CLS] and [SEP] included)."""
    tokenizer.no_truncation()
    encoding = tokenizer.encode(text)
    # Index 0 is [CLS]; content tokens 1..tokens-2 plus the closing [SEP] make `tokens`.
    return text[: encoding.offsets[tokens - 2][1]]


# --- golden vectors ----------------------------------------------------------------------


def load_golden() -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))
    return golden


def test_golden_file_matches_the_pinned_model_and_texts() -> None:
    golden = load_golden()
    assert golden["model"] == MODEL_NAME
    assert golden["modelSha256"] == MODEL_SHA256
    assert golden["tokenizerSha256"] == TOKENIZER_SHA256
    assert {k: v["text"] for k, v in golden["vectors"].items()} == GOLDEN_TEXTS
    assert all(len(v["vector"]) == DIMENSIONS for v in golden["vectors"].values())


@pytest.mark.parametrize("name", sorted(GOLDEN_TEXTS))
def test_embeds_like_the_golden_vectors(local_embedding: LocalEmbedding, name: str) -> None:
    golden = np.asarray(load_golden()["vectors"][name]["vector"], dtype=np.float32)
    (fresh,) = embed(local_embedding, GOLDEN_TEXTS[name])
    assert cosine(fresh, golden) >= 0.99999


def test_a_batch_embeds_like_each_text_alone(local_embedding: LocalEmbedding) -> None:
    batched = embed(local_embedding, *GOLDEN_TEXTS.values())
    for row, text in zip(batched, GOLDEN_TEXTS.values(), strict=True):
        assert cosine(row, embed(local_embedding, text)[0]) >= 0.99999


def test_vectors_are_unit_norm_float32(local_embedding: LocalEmbedding) -> None:
    vectors = embed(local_embedding, *GOLDEN_TEXTS.values(), "x")
    assert vectors.dtype == np.float32
    assert vectors.shape == (4, DIMENSIONS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_unrelated_texts_are_less_similar_than_paraphrases(local_embedding: LocalEmbedding) -> None:
    fox, paraphrase, pasta = embed(
        local_embedding,
        GOLDEN_TEXTS["short"],
        "A fast brown fox leaps over a sleepy dog.",
        "Boil the pasta in salted water for nine minutes.",
    )
    assert cosine(fox, paraphrase) > cosine(fox, pasta) + 0.3


# --- truncation and token counts ----------------------------------------------------------


def test_reads_past_128_tokens_up_to_256(
    local_embedding: LocalEmbedding, truncating_tokenizer: Tokenizer
) -> None:
    text = f"{COOKING} {ASTRONOMY}"
    (full_count,) = local_embedding.count_tokens([text])
    assert 128 < full_count < MAX_TOKENS
    prefix = prefix_of(text, truncating_tokenizer, 128)
    assert local_embedding.count_tokens([prefix]) == [128]

    # A model that read only 128 tokens (the shipped tokenizer.json's setting) would see the
    # same input for both texts ...
    truncating_tokenizer.enable_truncation(128)
    assert truncating_tokenizer.encode(text).ids == truncating_tokenizer.encode(prefix).ids
    # ... this one reads the astronomy tail too.
    full, cut = embed(local_embedding, text, prefix)
    assert cosine(full, cut) < 0.98


def test_cuts_inputs_at_256_tokens(
    local_embedding: LocalEmbedding, truncating_tokenizer: Tokenizer
) -> None:
    text = f"{COOKING} {COOKING} {ASTRONOMY}"
    assert local_embedding.count_tokens([text])[0] > MAX_TOKENS
    prefix = prefix_of(text, truncating_tokenizer, MAX_TOKENS)
    assert local_embedding.count_tokens([prefix]) == [MAX_TOKENS]
    full, cut = embed(local_embedding, text, prefix)
    assert cosine(full, cut) >= 0.99999


def test_count_tokens_is_not_truncated(local_embedding: LocalEmbedding) -> None:
    long_text = " ".join([COOKING] * 4)
    (count,) = local_embedding.count_tokens([long_text])
    assert count > 400
    assert local_embedding.max_input_tokens == MAX_TOKENS == 256


def test_usage_counts_the_tokens_actually_read(local_embedding: LocalEmbedding) -> None:
    long_text = " ".join([COOKING] * 4)
    batch = local_embedding.embed(["hello world", long_text], CancelToken())
    assert batch.usage.requests == 1
    # [CLS] hello world [SEP] = 4, and the long text is read up to the 256-token cut.
    assert batch.usage.input_tokens == 4 + MAX_TOKENS


# --- texts counted, then embedded: tokenized once ------------------------------------------


class _Tokenizing:
    """The adapter's truncating tokenizer, recording the texts it is asked to tokenize."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.texts: list[str] = []

    def encode_batch_fast(self, texts: list[str]) -> list[Any]:
        self.texts += texts
        return self.inner.encode_batch_fast(texts)


@pytest.fixture
def tokenizing(monkeypatch: pytest.MonkeyPatch) -> tuple[LocalEmbedding, _Tokenizing]:
    adapter = LocalEmbedding(threads=1)
    spy = _Tokenizing(adapter._encoder)
    monkeypatch.setattr(adapter, "_encoder", spy)
    return adapter, spy


def test_texts_just_counted_embed_exactly_like_texts_never_counted(
    local_embedding: LocalEmbedding,
) -> None:
    # One over the model's input: counted whole, embedded cut at 256 tokens.
    texts = [GOLDEN_TEXTS["short"], " ".join([COOKING] * 4), GOLDEN_TEXTS["non_ascii"]]
    with ThreadPoolExecutor(1) as other:  # a thread that counted nothing
        never = other.submit(local_embedding.embed, texts, CancelToken()).result()
    local_embedding.count_tokens(texts)
    counted = local_embedding.embed(texts, CancelToken())
    np.testing.assert_array_equal(counted.vectors, never.vectors)
    assert counted.usage == never.usage
    assert counted.usage.input_tokens == sum(
        min(n, MAX_TOKENS) for n in local_embedding.count_tokens(texts)
    )


def test_embed_tokenizes_only_what_this_thread_did_not_just_count(
    tokenizing: tuple[LocalEmbedding, _Tokenizing],
) -> None:
    adapter, spy = tokenizing
    long_text = " ".join([COOKING] * 4)
    texts = [GOLDEN_TEXTS["short"], long_text, GOLDEN_TEXTS["paragraph"]]
    adapter.count_tokens(texts)
    adapter.embed([*texts, ASTRONOMY], CancelToken())
    # The one over the model's input is tokenized again, cut; the one never counted, too.
    assert spy.texts == [long_text, ASTRONOMY]
    # Each counted encoding serves one embed: the same texts again are tokenized again.
    spy.texts.clear()
    adapter.embed(texts, CancelToken())
    assert spy.texts == texts


def test_another_threads_count_is_not_reused(
    tokenizing: tuple[LocalEmbedding, _Tokenizing],
) -> None:
    adapter, spy = tokenizing
    texts = [GOLDEN_TEXTS["short"], GOLDEN_TEXTS["paragraph"]]
    with ThreadPoolExecutor(1) as other:
        other.submit(adapter.count_tokens, texts).result()
    adapter.embed(texts, CancelToken())
    assert spy.texts == texts


def test_a_count_of_more_than_a_slice_keeps_no_encodings(
    tokenizing: tuple[LocalEmbedding, _Tokenizing],
) -> None:
    adapter, spy = tokenizing
    texts = [f"passage number {i}" for i in range(embedding_local.REUSE_COUNTED + 1)]
    adapter.count_tokens(texts[:2])
    adapter.count_tokens(texts)  # replaces the last count, and keeps nothing itself
    adapter.embed(texts[:2], CancelToken())
    assert spy.texts == texts[:2]


def test_a_cancelled_token_stops_before_inference(local_embedding: LocalEmbedding) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(RetrievalError) as info:
        local_embedding.embed(["hello"], token)
    assert info.value.code is ErrorCode.CANCELLED


def _rss_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) // 1024


LONG_PASSAGES = [("harbour crane ferry tide mooring " * 60)[: 1200 + i] for i in range(16)]


def test_a_large_call_gives_the_arena_back_when_it_ends() -> None:
    # Two batches of 8 full-length passages grow onnxruntime's arena by ~140 MiB, which it
    # kept for good before the arena was shrunk at the end of a call.
    fresh = LocalEmbedding(threads=1, batch_size=8, batch_width=MAX_TOKENS)
    fresh.embed(["warm up"], CancelToken())
    before = _rss_mib()
    fresh.embed(LONG_PASSAGES, CancelToken())
    assert _rss_mib() - before < 64


class _CancelAfterFirstBatch(CancelToken):
    def progress(self) -> None:
        self.cancel()


class _RecordingSession:
    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.shrinking_runs = 0

    def run(self, names: Any, feeds: Any, run_options: ort.RunOptions) -> Any:
        try:
            entry = run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage")
        except RuntimeError:  # not set
            entry = None
        self.shrinking_runs += entry == "cpu:0"
        return self.session.run(names, feeds, run_options=run_options)


def test_small_calls_give_the_arena_back_once_they_add_up_to_a_large_one() -> None:
    # The files of a batch ingest: each call a passage or two, none large on its own.
    fresh = LocalEmbedding(threads=1)
    recording = _RecordingSession(fresh._session)
    fresh._session = recording
    passage = LONG_PASSAGES[0]
    [tokens] = fresh.count_tokens([passage])
    calls = LARGE_CALL_TOKENS // min(tokens, MAX_TOKENS)
    for _ in range(calls):
        fresh.embed([passage], CancelToken())
    assert recording.shrinking_runs == 0  # not yet more than a large call's tokens
    fresh.embed([passage], CancelToken())
    assert recording.shrinking_runs == 1
    fresh.embed([passage], CancelToken())
    assert recording.shrinking_runs == 1  # counted again from the shrink


def test_small_calls_wait_for_the_adapter_to_go_idle_before_shrinking() -> None:
    lanes = LocalEmbedding(threads=2)
    recording = _RecordingSession(lanes._session)
    held = threading.Event()
    running = threading.Event()

    class Holding(_RecordingSession):
        def run(self, names: Any, feeds: Any, run_options: ort.RunOptions) -> Any:
            if feeds["input_ids"].shape[1] == 3:  # the held call: "[CLS] held [SEP]"
                running.set()
                assert held.wait(30)
            return recording.run(names, feeds, run_options)

    lanes._session = Holding(lanes._session)
    lanes._unshrunk_tokens = LARGE_CALL_TOKENS  # as if small calls had added up already
    waiting = threading.Thread(target=lambda: lanes.embed(["held"], CancelToken()))
    waiting.start()
    assert running.wait(30)
    lanes.embed(["a query"], CancelToken())
    assert recording.shrinking_runs == 0  # another call is still in flight
    held.set()
    waiting.join(30)
    assert recording.shrinking_runs == 1  # the last one out shrinks


def test_a_cancelled_large_call_gives_the_arena_back_too() -> None:
    fresh = LocalEmbedding(threads=1, batch_size=8, batch_width=MAX_TOKENS)
    recording = _RecordingSession(fresh._session)
    fresh._session = recording
    fresh.embed(["a query"], CancelToken())
    assert recording.shrinking_runs == 0  # a query's call keeps the arena as it is
    with pytest.raises(RetrievalError) as info:
        fresh.embed(LONG_PASSAGES, _CancelAfterFirstBatch())
    assert info.value.code is ErrorCode.CANCELLED
    assert recording.shrinking_runs == 1


def test_describes_itself_as_the_pinned_local_model(local_embedding: LocalEmbedding) -> None:
    assert local_embedding.descriptor == EmbeddingDescriptor(
        provider_id="local-minilm",
        vendor="sentence-transformers",
        account_id="local",
        auth_mode="local",
        model="all-MiniLM-L6-v2-int8",
        dimensions=384,
        metric="cosine",
    )


# --- pinned digests ----------------------------------------------------------------------


class _SessionSpy:
    """Wraps onnxruntime.InferenceSession to record whether a session was ever created."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def session_spy(monkeypatch: pytest.MonkeyPatch) -> _SessionSpy:
    # The adapter looks the class up on the onnxruntime module at each load.
    spy = _SessionSpy(ort.InferenceSession)
    monkeypatch.setattr(ort, "InferenceSession", spy)
    return spy


def test_refuses_tampered_weights_before_creating_a_session(
    tmp_path: Path, session_spy: _SessionSpy
) -> None:
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(embedding_local.pinned_model_path(), tampered)
    with tampered.open("r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0x01]))

    with pytest.raises(RetrievalError) as info:
        LocalEmbedding(model_path=tampered)
    assert info.value.code is ErrorCode.EMBEDDING_FAILED
    assert info.value.reason == "weights-digest-mismatch"
    assert session_spy.calls == 0


def test_refuses_a_tampered_tokenizer_before_creating_a_session(
    tmp_path: Path, session_spy: _SessionSpy
) -> None:
    original = embedding_local.pinned_tokenizer_path().read_text(encoding="utf-8")
    # Still a valid tokenizer, only one vocabulary entry renamed: the digest, not a parse
    # error, is what refuses it.
    assert '"fox":' in original
    tampered = tmp_path / "tokenizer.json"
    tampered.write_text(original.replace('"fox":', '"f0x":', 1), encoding="utf-8")
    Tokenizer.from_file(str(tampered))

    with pytest.raises(RetrievalError) as info:
        LocalEmbedding(tokenizer_path=tampered)
    assert info.value.code is ErrorCode.EMBEDDING_FAILED
    assert info.value.reason == "weights-digest-mismatch"
    assert session_spy.calls == 0


def test_an_identical_copy_of_the_weights_loads(
    tmp_path: Path, session_spy: _SessionSpy, local_embedding: LocalEmbedding
) -> None:
    copy = tmp_path / "model.onnx"
    shutil.copyfile(embedding_local.pinned_model_path(), copy)
    adapter = LocalEmbedding(model_path=copy)
    assert session_spy.calls == 1
    np.testing.assert_allclose(
        embed(adapter, "hello"), embed(local_embedding, "hello"), rtol=0, atol=1e-6
    )


def test_a_missing_weights_file_is_an_embedding_failure(tmp_path: Path) -> None:
    with pytest.raises(RetrievalError) as info:
        LocalEmbedding(model_path=tmp_path / "absent.onnx")
    assert info.value.code is ErrorCode.EMBEDDING_FAILED


# --- regeneration ------------------------------------------------------------------------


def write_golden() -> None:
    """Recompute golden_vectors.json (384 floats per text, 7 significant digits)."""
    adapter = LocalEmbedding(threads=1)
    vectors = embed(adapter, *GOLDEN_TEXTS.values())
    doc = {
        "model": MODEL_NAME,
        "modelSha256": MODEL_SHA256,
        "tokenizerSha256": TOKENIZER_SHA256,
        "generatedBy": "python -m tests.adapters.test_embedding_local",
        "vectors": {
            name: {"text": text, "vector": [float(f"{v:.7g}") for v in row.tolist()]}
            for (name, text), row in zip(GOLDEN_TEXTS.items(), vectors, strict=True)
        },
    }
    GOLDEN_FILE.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_golden()


# --- lanes and batches ----------------------------------------------------------------------


class _GatedSession:
    """A session whose first `gate` runs wait for each other: proves that many run at once."""

    def __init__(self, session: ort.InferenceSession, gate: int) -> None:
        self.session = session
        self.barrier = threading.Barrier(gate, timeout=60)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.runs = 0
        self.shapes: list[tuple[int, int]] = []

    def run(self, names: Any, feeds: Any, run_options: ort.RunOptions) -> Any:
        with self.lock:
            self.running += 1
            self.runs += 1
            first = self.runs <= self.barrier.parties
            self.most = max(self.most, self.running)
            self.shapes.append(feeds["input_ids"].shape)
        try:
            if first:
                self.barrier.wait()
            return self.session.run(names, feeds, run_options=run_options)
        finally:
            with self.lock:
                self.running -= 1


def test_one_call_runs_on_every_lane_and_no_more() -> None:
    lanes = LocalEmbedding(threads=2)
    gated = _GatedSession(lanes._session, gate=2)
    lanes._session = gated
    # Two full passages: two runs of one each, which must be running together to pass the gate.
    vectors = lanes.embed(LONG_PASSAGES[:2], CancelToken()).vectors
    assert gated.most == 2
    np.testing.assert_allclose(vectors, embed(lanes, *LONG_PASSAGES[:2]), rtol=0, atol=1e-6)


def test_concurrent_calls_share_the_lanes() -> None:
    lanes = LocalEmbedding(threads=2)
    gated = _GatedSession(lanes._session, gate=2)
    lanes._session = gated
    calls = [LONG_PASSAGES[i : i + 4] for i in range(0, 16, 4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda texts: lanes.embed(texts, CancelToken()), calls))
    # Four callers, never more than two runs; the last one out shrinks the arena (a run of
    # [CLS] [SEP]: the calls added up to more than a large call's tokens).
    passages = [s for s in gated.shapes if s != (1, 2)]
    assert len(passages) == 16 and len(gated.shapes) == 17 and gated.most == 2
    assert all(r.vectors.shape == (4, DIMENSIONS) for r in results)


def test_batches_hold_similar_lengths_within_a_token_budget() -> None:
    adapter = LocalEmbedding(threads=1, batch_size=32, run_tokens=256)
    gated = _GatedSession(adapter._session, gate=1)
    adapter._session = gated
    questions = [f"Does harbour rule {n} apply to ferries?" for n in range(20)]
    texts = [LONG_PASSAGES[0], *questions, LONG_PASSAGES[1]]
    vectors = adapter.embed(texts, CancelToken()).vectors
    # The questions (about a dozen tokens each) share runs; each long passage runs alone.
    assert all(rows * width <= 256 for rows, width in gated.shapes)
    assert sorted(rows for rows, width in gated.shapes if width > 64) == [1, 1]
    assert sum(rows for rows, _ in gated.shapes) == len(texts)
    assert len(gated.shapes) <= 4
    # Batched or alone, padded or not: the same vectors.
    alone = LocalEmbedding(threads=1, batch_size=1)
    np.testing.assert_allclose(vectors, embed(alone, *texts), rtol=0, atol=1e-5)


def test_texts_wider_than_the_batch_width_run_alone() -> None:
    # Passages of ~80 tokens: several fit the 256-token budget, but each runs alone by default
    # (faster for passages end to end); with a wider batch width they share runs.
    passages = [("harbour crane ferry tide mooring " * 20)[: 400 + i] for i in range(4)]
    shapes = {}
    for width in (64, MAX_TOKENS):
        adapter = LocalEmbedding(threads=1, run_tokens=256, batch_width=width)
        gated = _GatedSession(adapter._session, gate=1)
        adapter._session = gated
        adapter.embed(passages, CancelToken())
        shapes[width] = sorted(rows for rows, _ in gated.shapes)
        assert all(64 < w <= 128 for _, w in gated.shapes)
    assert shapes[64] == [1, 1, 1, 1]
    assert sum(shapes[MAX_TOKENS]) == 4 and max(shapes[MAX_TOKENS]) > 1


def test_a_cancel_stops_every_lane_and_frees_them() -> None:
    lanes = LocalEmbedding(threads=2)
    cancel = _CancelAfterFirstBatch()
    with pytest.raises(RetrievalError) as info:
        lanes.embed(LONG_PASSAGES, cancel)
    assert info.value.code is ErrorCode.CANCELLED
    # Both lanes are free again: a call after it runs on both at once.
    gated = _GatedSession(lanes._session, gate=2)
    lanes._session = gated
    lanes.embed(LONG_PASSAGES[:2], CancelToken())
    assert gated.most == 2


@pytest.mark.parametrize(
    "kwargs", [{"threads": 0}, {"batch_size": 0}, {"run_tokens": 0}, {"batch_width": 0}]
)
def test_refuses_a_shape_without_room(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LocalEmbedding(**kwargs)


def test_the_local_model_writes_nothing_under_home(tmp_path: Path) -> None:
    """onnxruntime wrote a device id and a telemetry event cache under `$HOME/.cache/
    Microsoft` (probe A, session 42): the host sets `ORT_DISABLE_TELEMETRY` first. In a fresh
    process, as a host starts: this one imported onnxruntime before any adapter did."""
    home = tmp_path / "home"
    home.mkdir()
    environ = {
        k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")
    }
    child = (
        "from retrieval_host.adapters.embedding_local import LocalEmbedding\n"
        "from retrieval_host.core.cancel import CancelToken\n"
        "print(len(LocalEmbedding().embed(['rotate a token'], CancelToken()).vectors))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        env={**environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-2000:]
    assert [str(p.relative_to(home)) for p in home.rglob("*")] == []

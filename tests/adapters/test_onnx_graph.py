"""The local model's graph without its attention NaN guards: the same outputs bit for bit.

Runs the pinned model file as shipped and as rewritten, with onnxruntime's basic graph
optimizations (the adapter's), on batches with and without padding; the rewrite's matching
rules on small graphs written with the same field subset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from retrieval_host.adapters.embedding_local import (
    GRAPH_OPTIMIZATION,
    MAX_TOKENS,
    pinned_model_path,
    pinned_tokenizer_path,
)
from retrieval_host.adapters.onnx_graph import _message_classes, without_nan_guards

TEXTS = [
    "ok",
    "Does harbour rule 7 apply to ferries?",
    "The harbour master closes the outer mooring when the tide falls below two metres. " * 3,
    ("harbour crane ferry tide mooring " * 80),  # cut at 256 tokens
]


@pytest.fixture(scope="module")
def sessions() -> tuple[ort.InferenceSession, ort.InferenceSession]:
    shipped = pinned_model_path().read_bytes()
    rewritten, removed = without_nan_guards(shipped)
    assert removed == 6  # one per attention layer
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = GRAPH_OPTIMIZATION

    def load(model: bytes) -> ort.InferenceSession:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    return load(shipped), load(rewritten)


def _feeds(texts: list[str]) -> dict[str, np.ndarray]:
    tokenizer = Tokenizer.from_file(str(pinned_tokenizer_path()))
    tokenizer.enable_truncation(MAX_TOKENS)
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize(
    "texts",
    [[t] for t in TEXTS] + [TEXTS, TEXTS[:3]],
    ids=["short", "question", "paragraph", "cut", "padded-4", "padded-3"],
)
def test_the_rewritten_graph_gives_the_same_hidden_states_bit_for_bit(
    sessions: tuple[ort.InferenceSession, ort.InferenceSession], texts: list[str]
) -> None:
    shipped, rewritten = sessions
    feeds = _feeds(texts)
    (expected,) = shipped.run(["last_hidden_state"], feeds)
    (actual,) = rewritten.run(["last_hidden_state"], feeds)
    assert np.isfinite(expected).all()
    assert np.array_equal(actual, expected)


def test_the_rewrite_is_idempotent_and_keeps_the_weights() -> None:
    shipped = pinned_model_path().read_bytes()
    rewritten, _ = without_nan_guards(shipped)
    again, removed = without_nan_guards(rewritten)
    assert (again, removed) == (rewritten, 0)
    # Twelve nodes fewer; every weight byte kept (the file is ~22 MB of weights).
    assert 0 < len(shipped) - len(rewritten) < 2_000
    assert _op_types(rewritten).count("Where") == _op_types(shipped).count("Where") - 6
    assert "IsNaN" not in _op_types(rewritten)


def _op_types(model: bytes) -> list[str]:
    return [node.op_type for node in _message_classes()["Model"].FromString(model).graph.node]


def _graph(nodes: list[tuple[str, list[str], list[str]]], outputs: list[str]) -> bytes:
    messages = _message_classes()
    model: Any = messages["Model"]()
    for op_type, inputs, node_outputs in nodes:
        model.graph.node.add(op_type=op_type, input=inputs, output=node_outputs)
    for name in outputs:
        model.graph.output.add(name=name)
    return bytes(model.SerializeToString())


def _wiring(model: bytes) -> list[tuple[str, list[str]]]:
    parsed = _message_classes()["Model"].FromString(model)
    return [(node.op_type, list(node.input)) for node in parsed.graph.node]


GUARDED = [
    ("Softmax", ["scores"], ["p"]),
    ("IsNaN", ["p"], ["nan"]),
    ("Where", ["nan", "zero", "p"], ["guarded"]),
    ("MatMul", ["guarded", "v"], ["out"]),
]


def test_a_guard_is_bypassed_and_its_readers_rewired() -> None:
    rewritten, removed = without_nan_guards(_graph(GUARDED, ["out"]))
    assert removed == 1
    assert _wiring(rewritten) == [("Softmax", ["scores"]), ("MatMul", ["p", "v"])]


def test_a_guard_whose_test_is_read_elsewhere_stays() -> None:
    model = _graph([*GUARDED, ("Not", ["nan"], ["finite"])], ["out", "finite"])
    assert without_nan_guards(model) == (model, 0)


def test_a_guard_that_is_a_graph_output_stays() -> None:
    model = _graph(GUARDED, ["guarded"])
    assert without_nan_guards(model) == (model, 0)


def test_a_where_that_replaces_something_else_stays() -> None:
    # Where(IsNaN(p), 0, q): a different value where p is NaN; not a guard of q.
    model = _graph(
        [
            ("Softmax", ["scores"], ["p"]),
            ("IsNaN", ["p"], ["nan"]),
            ("Where", ["nan", "zero", "q"], ["picked"]),
        ],
        ["picked"],
    )
    assert without_nan_guards(model) == (model, 0)


def test_a_guard_of_anything_but_a_softmax_stays() -> None:
    model = _graph([("Relu", ["scores"], ["p"]), *GUARDED[1:]], ["out"])
    assert without_nan_guards(model) == (model, 0)


def test_a_graph_with_subgraphs_is_left_as_it_is() -> None:
    # A branch's nodes (an attribute, not read here) could read the guard's output by name.
    model = _graph([*GUARDED, ("If", ["cond"], ["branch"])], ["out", "branch"])
    assert without_nan_guards(model) == (model, 0)

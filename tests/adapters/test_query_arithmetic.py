"""int8 query arithmetic: the graph rewrite, the adapter's query session, its wiring.

The real pinned model throughout: the rewrite's vectors are compared with the float32 ones
(close, not equal: the activations are quantized), a query's vector must not depend on what
else is embedded with it, and passages must embed exactly as before.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from retrieval_host.adapters import embedding_local
from retrieval_host.adapters.embedding_local import LocalEmbedding, pinned_model_path
from retrieval_host.adapters.onnx_graph import (
    _message_classes,
    with_integer_matmuls,
    without_nan_guards,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.service import RetrievalService
from retrieval_host.example_acl import create_driver
from retrieval_host.settings import SettingsError
from tests.support.example_host import example_settings

QUESTIONS = [
    "Does harbour rule 7 apply to ferries?",
    "0-dimensional biomaterials show inductive properties.",
    "Which invoice numbers were disputed in the March statement?",
    "what is the tide",
    "Error E1234 in module foo.bar",
    "ferry",
]


@pytest.fixture(scope="module")
def adapter() -> LocalEmbedding:
    return LocalEmbedding(threads=2, query_arithmetic="int8")


def _op_types(model: bytes) -> list[str]:
    return [node.op_type for node in _message_classes()["Model"].FromString(model).graph.node]


def test_the_rewrite_computes_every_weight_product_in_integers() -> None:
    graph, _ = without_nan_guards(pinned_model_path().read_bytes())
    rewritten, count = with_integer_matmuls(graph)
    assert count == 36  # six layers: query, key, value, output and the two feed-forward
    ops = _op_types(rewritten)
    assert ops.count("MatMulIntegerToFloat") == 36
    # Each activation quantized once: a layer's query, key and value share theirs.
    assert ops.count("DynamicQuantizeLinear") == 24
    # Left: the attention's two products per layer, on activations only.
    assert ops.count("MatMul") == _op_types(graph).count("MatMul") - 36 == 12
    assert ops.count("Cast") == _op_types(graph).count("Cast") - 36
    opsets = _message_classes()["Model"].FromString(rewritten).opset_import
    assert ("com.microsoft", 1) in [(o.domain, o.version) for o in opsets]
    assert with_integer_matmuls(rewritten) == (rewritten, 0)


def _graph(nodes: list[tuple[str, list[str], list[str]]], tensors: dict[str, Any]) -> bytes:
    messages = _message_classes()
    model: Any = messages["Model"]()
    for op_type, inputs, outputs in nodes:
        model.graph.node.add(op_type=op_type, input=inputs, output=outputs)
    for name, (data_type, dims) in tensors.items():
        model.graph.initializer.add(name=name, data_type=data_type, dims=dims)
    model.graph.output.add(name="y")
    return bytes(model.SerializeToString())


DEQUANTIZED = [
    ("Cast", ["w"], ["wf"]),
    ("Mul", ["wf", "s"], ["w_deq"]),
    ("MatMul", ["x", "w_deq"], ["y"]),
]


@pytest.mark.parametrize(
    ("tensors", "nodes", "expected"),
    [
        ({"w": (3, [4, 8]), "s": (1, [1, 8])}, DEQUANTIZED, 1),
        ({"w": (3, [4, 8]), "s": (1, [8])}, DEQUANTIZED, 1),
        # The scale first: Mul is commutative.
        (
            {"w": (3, [4, 8]), "s": (1, [8])},
            [DEQUANTIZED[0], ("Mul", ["s", "wf"], ["w_deq"]), DEQUANTIZED[2]],
            1,
        ),
        ({"w": (1, [4, 8]), "s": (1, [8])}, DEQUANTIZED, 0),  # float weights
        ({"w": (3, [4, 8]), "s": (1, [4])}, DEQUANTIZED, 0),  # a scale per row
        ({"w": (3, [4, 8]), "s": (1, [1])}, DEQUANTIZED, 0),  # one scale for all
        ({"s": (1, [8])}, DEQUANTIZED, 0),  # computed weights
        (
            {"w": (3, [4, 8]), "s": (1, [8])},
            [*DEQUANTIZED, ("If", ["c"], ["z"])],  # a graph with subgraphs
            0,
        ),
    ],
    ids=[
        "column-scales",
        "flat-scales",
        "scale-first",
        "float-weights",
        "row-scales",
        "one-scale",
        "computed",
        "subgraph",
    ],
)
def test_only_int8_weights_with_column_scales_are_rewritten(
    tensors: dict[str, Any], nodes: list[tuple[str, list[str], list[str]]], expected: int
) -> None:
    model = _graph(nodes, tensors)
    rewritten, count = with_integer_matmuls(model)
    assert count == expected
    if not expected:
        assert rewritten == model


def test_a_dequantized_weight_read_elsewhere_is_kept() -> None:
    model = _graph(
        [*DEQUANTIZED, ("Add", ["w_deq", "x"], ["z"])], {"w": (3, [4, 8]), "s": (1, [8])}
    )
    rewritten, count = with_integer_matmuls(model)
    assert count == 1
    assert _op_types(rewritten) == [
        "Cast",
        "Mul",
        "DynamicQuantizeLinear",
        "MatMulIntegerToFloat",
        "Add",
    ]


def test_query_vectors_are_close_to_the_float32_ones(adapter: LocalEmbedding) -> None:
    cancel = CancelToken()
    exact = adapter.embed(QUESTIONS, cancel).vectors
    fast = adapter.queries.embed(QUESTIONS, cancel).vectors
    assert fast.dtype == np.float32 and fast.shape == exact.shape
    np.testing.assert_allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(exact * fast, axis=1)
    # Measured on AVX-512 VNNI: 0.985-0.996; not equal (the activations are quantized).
    assert cosines.min() >= embedding_local.INT8_MIN_COSINE
    assert np.median(cosines) >= 0.985
    assert not np.array_equal(exact, fast)
    assert 0.95 <= adapter.check_query_arithmetic() < 1.0


def test_a_query_gets_the_same_vector_whatever_is_embedded_with_it(
    adapter: LocalEmbedding,
) -> None:
    cancel = CancelToken()
    alone = adapter.queries.embed([QUESTIONS[0]], cancel).vectors[0]
    for companions in (QUESTIONS[1:3], QUESTIONS[3:], ["x " * 200]):
        together = adapter.queries.embed([*companions, QUESTIONS[0]], cancel).vectors[-1]
        assert np.array_equal(together, alone)


def test_passages_embed_exactly_as_without_it(adapter: LocalEmbedding) -> None:
    plain = LocalEmbedding(threads=1)
    cancel = CancelToken()
    assert plain.queries is plain
    assert adapter.queries.descriptor == adapter.descriptor == plain.descriptor
    assert np.array_equal(
        adapter.embed(QUESTIONS, cancel).vectors, plain.embed(QUESTIONS, cancel).vectors
    )


def test_a_cpu_whose_integer_kernels_drift_is_refused(
    adapter: LocalEmbedding, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedding_local, "INT8_MIN_COSINE", 0.99999)
    with pytest.raises(ValueError, match="leave it at float32"):
        adapter.check_query_arithmetic()


def test_refuses_an_unknown_arithmetic() -> None:
    with pytest.raises(ValueError, match="'float32' or 'int8'"):
        LocalEmbedding(query_arithmetic="fp16")  # type: ignore[arg-type]


class _CountingSession:
    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.runs = 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return self.session.run(*args, **kwargs)


def test_the_example_application_searches_with_int8_queries_when_asked(tmp_path: Path) -> None:
    driver = create_driver(example_settings(tmp_path, queryArithmetic="int8"), {})
    try:
        corpus = driver.retrieval.corpus("library")
        assert isinstance(corpus.embedding, LocalEmbedding)
        counting = _CountingSession(corpus.embedding._integer_session)
        corpus.embedding._integer_session = counting
        alice = RequestContext(subject="alice")
        for source, text in (
            ("tides", "The outer mooring closes when the tide falls below two metres."),
            ("invoices", "Invoice 4411 was disputed by the buyer in March."),
        ):
            driver.index_context(
                IndexRequest(
                    "library",
                    SourceInfo(source, "r1", source),
                    [ChunkInput(f"{source}-1", text, Location(page=1, start_line=1, end_line=1))],
                ),
                alice,
            )
        assert counting.runs == 0  # passages: float32
        found = driver.search_context(
            SearchRequest("library", "when does the mooring close?", mode="dense"), alice
        )
        assert counting.runs == 1
        assert found.hits[0].source.id == "tides"
    finally:
        driver.close()


@pytest.mark.parametrize("value", ["fp16", 8, None])
def test_the_example_application_refuses_an_unknown_arithmetic(
    tmp_path: Path, value: object
) -> None:
    with pytest.raises(SettingsError, match="queryArithmetic"):
        create_driver(example_settings(tmp_path, queryArithmetic=value), {})


def test_a_query_embedding_of_another_model_is_refused(tmp_path: Path) -> None:
    driver = create_driver(example_settings(tmp_path), {})
    try:
        corpus = driver.retrieval.corpus("library")

        class _Other:
            descriptor = dataclasses.replace(corpus.embedding.descriptor, model="another")

        with pytest.raises(RetrievalError) as refused:
            RetrievalService([dataclasses.replace(corpus, query_embedding=_Other())])  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.INVALID_REQUEST
        assert "query embedding is another model" in str(refused.value)
    finally:
        driver.close()


@pytest.mark.parametrize("options", [{"aclfile": "acl.json"}, {"embedingThreads": 1}, {"x": 1}])
def test_the_example_application_refuses_an_unknown_option(
    tmp_path: Path, options: dict[str, object]
) -> None:
    """A misspelled `aclFile` served the default `acl.json` instead of the file named."""
    with pytest.raises(SettingsError, match="applicationOptions: unknown option"):
        create_driver(example_settings(tmp_path, **options), {})

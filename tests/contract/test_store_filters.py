"""Property: both stores apply a metadata filter exactly as `core.filters.matches` says.

SQLite evaluates the parsed tree in Python, PostgreSQL compiles it to SQL over `jsonb`
(`adapters.postgres.filters`): random metadata and random filters (every operator, `and`/`or`
nesting, values of every JSON kind, numbers that differ only past double precision) must
select the same sources in the dense and the lexical search as the reference does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.filters import MAX_DEPTH, matches, parse_filter
from retrieval_host.core.ports import CapacityLimits
from tests.contract.conftest import STORE_KINDS, ContractStore, _open_store
from tests.support.sqlite_store import descriptor, revision, unit_vectors

DIM = 4
KEYS = ("lang", "year", "and", "tag")
_corpus_ids = itertools.count()

# Values chosen to meet at the edges: 1 and 1.0 and true, "10" and "9" (string order), a
# float and an integer above 2**53 that a double would confuse, code points past U+FFFF.
SCALARS: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    1,
    1.0,
    -2.5,
    2**60,
    2**60 + 1,
    1e20,
    "",
    "en",
    "de",
    "10",
    "9",
    "é",
    "\U0001f600",
)
scalars = st.sampled_from(SCALARS)
values = st.one_of(scalars, st.just([1, "en"]), st.just({"x": 1}))
metadatas = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
orderable = scalars.filter(lambda v: isinstance(v, int | float | str) and not isinstance(v, bool))
operator_objects = st.dictionaries(
    st.sampled_from(("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte")),
    st.just(None),  # replaced per operator below
    min_size=1,
    max_size=2,
).flatmap(
    lambda ops: st.fixed_dictionaries(
        {
            op: st.lists(scalars, min_size=1, max_size=3)
            if op in ("in", "nin")
            else (orderable if op in ("gt", "gte", "lt", "lte") else scalars)
            for op in ops
        }
    )
)
clauses = st.one_of(scalars, operator_objects)


def filters(depth: int = 1) -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.dictionaries(st.sampled_from(KEYS), clauses, max_size=3)
    if depth >= MAX_DEPTH:
        return leaf
    nested = st.lists(st.deferred(lambda: filters(depth + 1)), min_size=1, max_size=3)
    combinator = st.tuples(st.sampled_from(("and", "or")), nested).map(lambda kv: {kv[0]: kv[1]})
    return st.one_of(leaf, st.tuples(leaf, combinator).map(lambda p: {**p[0], **p[1]}))


@pytest.fixture(scope="module", params=STORE_KINDS)
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ContractStore]:
    store = _open_store(str(request.param), tmp_path_factory.mktemp("filters"), scan_batch_rows=4)
    yield store
    store.close()


def _corpus(
    store: ContractStore, metadatas: list[dict[str, Any]]
) -> tuple[str, dict[str, str], np.typing.NDArray[np.float32]]:
    """A new corpus with one one-passage source `s{i}` per metadata (text "alpha beta"): its
    id, the grant of every source, and a query vector."""
    corpus_id = f"f{next(_corpus_ids)}"
    store.open_corpus(descriptor(corpus_id, dimensions=DIM))
    rng = np.random.default_rng(len(metadatas))
    allowed: dict[str, str] = {}
    for i, metadata in enumerate(metadatas):
        source, chunks = revision(
            f"s{i}", "r1", unit_vectors(rng, 1, DIM), metadata=metadata, texts=["alpha beta"]
        )
        store.replace_source(
            corpus_id, "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
        allowed[f"s{i}"] = "r1"
    return corpus_id, allowed, unit_vectors(rng, 1, DIM)[0]


@settings(max_examples=60, deadline=None)
@given(
    sources=st.lists(metadatas, min_size=1, max_size=8),
    cases=st.lists(filters(), min_size=1, max_size=6),
)
def test_both_searches_select_exactly_the_sources_the_reference_matches(
    shared_store: ContractStore, sources: list[dict[str, Any]], cases: list[dict[str, Any]]
) -> None:
    store = shared_store
    corpus_id, allowed, query = _corpus(store, sources)
    for raw in cases:
        tree = parse_filter(raw)
        expected = {f"s{i}" for i, m in enumerate(sources) if matches(tree, m)}
        k = len(sources)
        dense = store.search(corpus_id, "ns", allowed, query, k, CancelToken(), tree)
        lexical = store.lexical_search(corpus_id, "ns", allowed, ["alpha"], k, CancelToken(), tree)
        assert {h.source_id for h in dense} == expected, raw
        assert {h.source_id for h in lexical} == expected, raw
        # A hit shows the metadata the filter saw.
        assert all(h.metadata == sources[int(h.source_id[1:])] for h in dense)


@pytest.mark.parametrize("op", ["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte"])
def test_every_operator_against_every_kind_of_value(shared_store: ContractStore, op: str) -> None:
    # One source per value (and one without the key): every operand against every value.
    store = shared_store
    stored: list[dict[str, Any]] = [{}, {"v": [1]}, {"v": {"x": 1}}]
    stored += [{"v": value} for value in SCALARS]
    corpus_id, allowed, query = _corpus(store, stored)
    operands: list[Any]
    if op in ("in", "nin"):
        operands = [[v] for v in SCALARS] + [[1, "en", None], ["10", 2**60]]
    elif op in ("eq", "ne"):
        operands = list(SCALARS)
    else:
        operands = [v for v in SCALARS if not isinstance(v, bool) and v is not None]
    for operand in operands:
        tree = parse_filter({"v": {op: operand}})
        expected = {f"s{i}" for i, m in enumerate(stored) if matches(tree, m)}
        hits = store.search(corpus_id, "ns", allowed, query, len(stored), CancelToken(), tree)
        assert {h.source_id for h in hits} == expected, (op, operand)

"""Property: over random corpora and grants, search ranks exactly the allowed rows.

The reference is brute force in NumPy over the passages the grant allows (namespace, exact
current revision, metadata filter). Equality with it means nothing outside the grant is returned
*and* filtering happened before ranking (k results still come from the allowed rows).

The same holds for the lexical search, against a reference BM25 written here whose statistics
(N, df, average length) are those of the passages the search may rank (the allowed current
revisions matching the filter), never the rest of the namespace.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.filters import parse_filter
from retrieval_host.core.lexical import DEFAULT_ANALYZER, term_frequencies
from retrieval_host.core.ports import CapacityLimits
from tests.contract.conftest import STORE_KINDS, ContractStore, _open_store
from tests.support.sqlite_store import descriptor, revision, unit_vectors

NAMESPACES = ("n0", "n1", "n2")
SOURCES = ("s0", "s1", "s2", "s3", "s4")
DIM = 6
# Words the analyzer keeps as they are (no stop word, no stemming change).
WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "omega")
_corpus_ids = itertools.count()


@pytest.fixture(scope="module", params=STORE_KINDS)
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ContractStore]:
    # One store for all examples (each example gets its own corpus): small scan batches so
    # most searches span several of them.
    store = _open_store(str(request.param), tmp_path_factory.mktemp("props"), scan_batch_rows=3)
    yield store
    store.close()


@dataclass(frozen=True)
class History:
    """The revisions one (namespace, source) went through, and whether it was then deleted."""

    namespace: str
    source_id: str
    revisions: tuple[int, ...]  # chunk count per successive revision
    tier: int
    deleted: bool


histories = st.builds(
    History,
    namespace=st.sampled_from(NAMESPACES),
    source_id=st.sampled_from(SOURCES),
    revisions=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    tier=st.integers(0, 2),
    deleted=st.booleans(),
)
# The revision a grant names for a source: its current one, an older one, or one never written.
revision_choice = st.sampled_from(["current", "previous", "bogus"])
grants = st.tuples(
    st.sampled_from((*NAMESPACES, "n-missing")),
    st.dictionaries(st.sampled_from((*SOURCES, "ghost")), revision_choice, max_size=6),
)


@settings(max_examples=200, deadline=None)
@given(
    corpus=st.lists(
        histories, min_size=1, max_size=10, unique_by=lambda h: (h.namespace, h.source_id)
    ),
    grant=grants,
    tier_filter=st.none() | st.integers(0, 2),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_search_and_lexical_search_never_rank_a_row_outside_the_grant(
    shared_store: ContractStore,
    corpus: list[History],
    grant: tuple[str, dict[str, str]],
    tier_filter: int | None,
    k: int,
    seed: int,
) -> None:
    store = shared_store
    corpus_id = f"p{next(_corpus_ids)}"
    store.open_corpus(descriptor(corpus_id, dimensions=DIM))
    rng = np.random.default_rng(seed)
    limits = CapacityLimits()

    # What is current after writing every history: (namespace, source) -> (revision, vectors).
    current: dict[tuple[str, str], tuple[str, np.typing.NDArray[np.float32], int]] = {}
    texts: dict[tuple[str, str], list[str]] = {}
    for h in corpus:
        previous: str | None = None
        for number, count in enumerate(h.revisions, start=1):
            rev = f"r{number}"
            vectors = unit_vectors(rng, count, DIM)
            ids = [f"{h.namespace}/{h.source_id}/{rev}/{i}" for i in range(count)]
            words = [" ".join(rng.choice(WORDS, int(rng.integers(1, 6)))) for _ in range(count)]
            source, chunks = revision(
                h.source_id, rev, vectors, metadata={"tier": h.tier}, chunk_ids=ids, texts=words
            )
            texts[(h.namespace, h.source_id)] = words
            store.replace_source(
                corpus_id, h.namespace, source, chunks, expected_revision=previous, limits=limits
            )
            previous = rev
            current[(h.namespace, h.source_id)] = (rev, vectors, h.tier)
        if h.deleted:
            assert previous is not None
            assert store.delete_source(corpus_id, h.namespace, h.source_id, previous) == count
            del current[(h.namespace, h.source_id)]

    namespace, choices = grant
    allowed: dict[str, str] = {}
    for source_id, choice in choices.items():
        stored = current.get((namespace, source_id))
        latest = int(stored[0][1:]) if stored is not None else 1
        allowed[source_id] = {
            "current": f"r{latest}",
            "previous": f"r{max(latest - 1, 0)}",
            "bogus": "r9",
        }[choice]

    query = unit_vectors(rng, 1, DIM)[0]
    filters = parse_filter({"tier": tier_filter}) if tier_filter is not None else None
    hits = store.search(corpus_id, namespace, allowed, query, k, CancelToken(), filters)

    for hit in hits:
        hit_namespace, hit_source, hit_revision, _ = hit.chunk_id.split("/")
        assert hit_namespace == namespace
        assert allowed.get(hit.source_id) == hit.revision == hit_revision
        assert hit_source == hit.source_id

    reference: list[tuple[float, str]] = []
    for source_id, rev in allowed.items():
        stored = current.get((namespace, source_id))
        if stored is None or stored[0] != rev:
            continue
        if tier_filter is not None and stored[2] != tier_filter:
            continue
        scores = stored[1] @ query
        reference += [
            (float(s), f"{namespace}/{source_id}/{rev}/{i}") for i, s in enumerate(scores)
        ]
    reference.sort(key=lambda pair: -pair[0])
    assert [h.chunk_id for h in hits] == [cid for _, cid in reference[:k]]
    np.testing.assert_allclose([h.score for h in hits], [s for s, _ in reference[:k]], atol=1e-5)

    # The lexical search over the same corpus and grant.
    query_terms = [str(w) for w in rng.choice(WORDS, int(rng.integers(1, 4)))]
    lexical = store.lexical_search(
        corpus_id, namespace, allowed, query_terms, k, CancelToken(), filters
    )
    expected = reference_bm25(
        current, texts, namespace, allowed, tier_filter, query_terms, k1=0.9, b=0.4
    )
    assert [(round(h.score, 9), h.chunk_id) for h in lexical] == expected[:k]


def reference_bm25(
    current: dict[tuple[str, str], tuple[str, np.typing.NDArray[np.float32], int]],
    texts: dict[tuple[str, str], list[str]],
    namespace: str,
    allowed: dict[str, str],
    tier_filter: int | None,
    query: list[str],
    *,
    k1: float,
    b: float,
) -> list[tuple[float, str]]:
    """BM25 (the Lucene variant bm25s uses) by hand, statistics over the passages it ranks:
    the namespace's allowed current revisions that pass the filter."""
    passages = {
        f"{namespace}/{sid}/{rev}/{i}": (sid, term_frequencies(text, DEFAULT_ANALYZER))
        for (ns, sid), (rev, _, tier) in current.items()
        if ns == namespace
        and allowed.get(sid) == rev
        and (tier_filter is None or tier == tier_filter)
        for i, text in enumerate(texts[(ns, sid)])
    }
    if not passages:
        return []
    n = len(passages)
    average = sum(sum(tf.values()) for _, tf in passages.values()) / n
    df = Counter(term for _, tf in passages.values() for term in tf)
    ranked: list[tuple[float, str]] = []
    for chunk_id, (_, tf) in passages.items():
        length = sum(tf.values())
        score = 0.0
        for term, count in sorted(Counter(query).items()):
            if term in tf:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += count * idf * (tf[term] / (tf[term] + k1 * (1 - b + b * length / average)))
        if score > 0:
            ranked.append((round(score, 9), chunk_id))
    ranked.sort(key=lambda pair: (-pair[0], pair[1]))
    return ranked

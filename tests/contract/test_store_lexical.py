"""The lexical half of the store contract (`VectorStore.lexical_search`), over every adapter.

Scores are compared with a BM25 written out by hand (the Lucene variant bm25s uses,
`tests.support.lexical_reference`), whose statistics are those of the passages the search may
rank (the allowed revisions matching the filters); both stores must match it, and each other
bit for bit.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import LexicalDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.filters import MetadataFilter, parse_filter
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import Candidate, CapacityLimits
from tests.contract.conftest import STORE_KINDS, ContractStore, StoreHarness, _open_store
from tests.support.lexical_reference import reference
from tests.support.sqlite_store import descriptor, revision, unit_vectors

LIMITS = CapacityLimits()

DOCS = {
    "cells": [
        "Stem cells divide and differentiate into many cell types.",
        "Cell division is controlled by cyclins during the cell cycle.",
    ],
    "heart": [
        "Cardiac muscle cells contract rhythmically; the heart pumps blood.",
        "Blood pressure rises with age in most populations.",
    ],
    "virus": [
        "A virus replicates only inside the living cells of an organism.",
        "Vaccines train the immune system to recognise a virus.",
        "Influenza virus spreads in winter.",
    ],
}


def put(
    store: ContractStore,
    source_id: str,
    rev: str,
    texts: list[str],
    *,
    namespace: str = "ns",
    expected: str | None = None,
    corpus: str = "c1",
    metadata: dict[str, str] | None = None,
) -> None:
    vectors = unit_vectors(np.random.default_rng(len(texts)), len(texts))
    source, chunks = revision(source_id, rev, vectors, texts=texts, metadata=metadata)
    store.replace_source(
        corpus, namespace, source, chunks, expected_revision=expected, limits=LIMITS
    )


def lexical(
    store: ContractStore,
    allowed: dict[str, str],
    query: str,
    k: int = 10,
    *,
    namespace: str = "ns",
    corpus: str = "c1",
    **kwargs: object,
) -> list[Candidate]:
    return store.lexical_search(
        corpus,
        namespace,
        allowed,
        query_terms(query, DEFAULT_ANALYZER),
        k,
        CancelToken(),
        **kwargs,  # type: ignore[arg-type]
    )


def assert_ranked(hits: list[Candidate], expected: list[tuple[str, float]]) -> None:
    assert [h.chunk_id for h in hits] == [cid for cid, _ in expected]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in expected], atol=1e-6)


def load(store: ContractStore, namespace: str = "ns", corpus: str = "c1") -> dict[str, str]:
    for sid, texts in DOCS.items():
        put(store, sid, "r1", texts, namespace=namespace, corpus=corpus)
    return {sid: "r1" for sid in DOCS}


# --- ranking ---------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["cell division", "virus cells", "blood blood heart", "zebra"])
def test_lexical_search_ranks_by_bm25_over_the_namespace(store: ContractStore, query: str) -> None:
    grant = load(store)
    hits = lexical(store, grant, query)
    assert_ranked(hits, reference(DOCS, set(grant), query))
    assert all(h.revision == "r1" and h.text in DOCS[h.source_id] for h in hits)
    assert_ranked(lexical(store, grant, query, k=2), reference(DOCS, set(grant), query)[:2])


def test_the_corpus_descriptor_sets_k1_and_b(harness: StoreHarness) -> None:
    store = harness.open()
    tuned = descriptor("c2")
    store.open_corpus(
        type(tuned)(
            "c2", tuned.index_version, tuned.embedding, {}, LexicalDescriptor(k1=1.5, b=0.9)
        )
    )
    grant = load(store, corpus="c2")
    hits = lexical(store, grant, "cell virus", corpus="c2")
    assert_ranked(hits, reference(DOCS, set(grant), "cell virus", k1=1.5, b=0.9))


def test_equal_scores_come_in_chunk_id_order(store: ContractStore) -> None:
    for sid in ("b", "a", "c"):
        put(store, sid, "r1", ["identical passage text"])
    hits = lexical(store, {"a": "r1", "b": "r1", "c": "r1"}, "identical")
    assert [h.chunk_id for h in hits] == ["a:0", "b:0", "c:0"]
    assert len({h.score for h in hits}) == 1


def test_an_empty_query_or_grant_or_unknown_term_finds_nothing(store: ContractStore) -> None:
    grant = load(store)
    assert lexical(store, grant, "the of and") == []  # stop words only: no terms
    assert lexical(store, {}, "virus") == []
    assert lexical(store, grant, "virus", k=0) == []
    assert lexical(store, grant, "virus", namespace="elsewhere") == []


# --- filtering before ranking -------------------------------------------------------------------


def test_only_the_granted_exact_revisions_are_ranked(store: ContractStore) -> None:
    grant = load(store)
    # k=1: the best passage overall is about viruses, but it is not granted.
    hits = lexical(store, {"cells": "r1"}, "virus cells", k=1)
    assert_ranked(hits, reference(DOCS, {"cells"}, "virus cells")[:1])
    assert lexical(store, {"virus": "r0"}, "virus") == []  # another revision: nothing
    assert lexical(store, {"ghost": "r1"}, "virus") == []
    assert grant


def test_metadata_filters_apply_before_ranking(store: ContractStore) -> None:
    put(store, "virus", "r1", DOCS["virus"], metadata={"lang": "en"})
    put(store, "cells", "r1", DOCS["cells"], metadata={"lang": "de"})
    allowed = {"virus": "r1", "cells": "r1"}
    hits = lexical(store, allowed, "cells virus", k=1, filters=parse_filter({"lang": "de"}))
    assert [h.source_id for h in hits] == ["cells"]
    assert lexical(store, allowed, "cells", filters=parse_filter({"lang": "fr"})) == []


def test_statistics_are_per_namespace(store: ContractStore) -> None:
    grant = load(store)
    before = lexical(store, grant, "virus cells")
    # Many passages about viruses in another namespace change nothing here.
    put(store, "flood", "r1", ["virus virus virus"] * 20, namespace="other")
    assert lexical(store, grant, "virus cells") == before
    assert lexical(store, {"flood": "r1"}, "virus") == []  # not in this namespace
    flood = lexical(store, {"flood": "r1"}, "virus", namespace="other")
    assert [h.chunk_id for h in flood] == sorted(f"flood:{i}" for i in range(20))[:10]


# --- one whole revision ------------------------------------------------------------------------


def test_a_replaced_revision_leaves_no_lexical_entry(store: ContractStore) -> None:
    load(store)
    assert len(lexical(store, {"virus": "r1"}, "virus")) == 3  # this grant, searched before
    put(store, "virus", "r2", ["Bacteriophages infect bacteria."], expected="r1")
    assert lexical(store, {"virus": "r1"}, "virus") == []
    hits = lexical(store, {"virus": "r2"}, "bacteria")
    assert [h.chunk_id for h in hits] == ["virus:0"]
    docs = {**DOCS, "virus": ["Bacteriophages infect bacteria."]}
    grant = {"cells": "r1", "heart": "r1", "virus": "r2"}
    assert_ranked(lexical(store, grant, "cells"), reference(docs, set(grant), "cells"))


def test_a_delete_removes_the_lexical_entries_and_their_statistics(store: ContractStore) -> None:
    grant = load(store)
    assert store.delete_source("c1", "ns", "virus", "r1") == 3
    assert lexical(store, grant, "virus") == []
    docs = {sid: texts for sid, texts in DOCS.items() if sid != "virus"}
    assert_ranked(lexical(store, grant, "cells"), reference(docs, set(docs), "cells"))


def test_another_instance_sees_committed_lexical_entries(harness: StoreHarness) -> None:
    writer = harness.open()
    writer.open_corpus(descriptor("c1"))
    reader = harness.open()
    reader.open_corpus(descriptor("c1"))
    grant = load(writer)
    assert_ranked(lexical(reader, grant, "blood"), reference(DOCS, set(grant), "blood"))
    writer.delete_source("c1", "ns", "heart", "r1")
    assert lexical(reader, grant, "blood") == []


def test_a_reader_never_sees_half_a_revision(store: ContractStore) -> None:
    # The writer swaps between two revisions of one source; every passage of a revision names
    # it. A reader granted either revision sees all of that revision's passages, or none.
    texts = {rev: [f"marker {rev} passage number {i}" for i in range(6)] for rev in ("r1", "r2")}
    put(store, "s", "r1", texts["r1"])
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            current = "r1"
            for _ in range(30):
                nxt = "r2" if current == "r1" else "r1"
                put(store, "s", nxt, texts[nxt], expected=current)
                current = nxt
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen = set()
    while not done.is_set():
        for rev in ("r1", "r2"):
            hits = lexical(store, {"s": rev}, f"marker {rev} passage")
            assert len(hits) in (0, 6)
            assert all(h.revision == rev and rev in h.text for h in hits)
            seen.add(len(hits))
    writer.join()
    assert errors == []
    assert 6 in seen


# --- cancellation -------------------------------------------------------------------------------


def test_a_cancelled_lexical_search_raises_cancelled(store: ContractStore) -> None:
    grant = load(store)
    token = CancelToken()
    token.cancel()
    with pytest.raises(RetrievalError) as excinfo:
        store.lexical_search("c1", "ns", grant, query_terms("virus", DEFAULT_ANALYZER), 5, token)
    assert excinfo.value.code is ErrorCode.CANCELLED


# --- passage context -------------------------------------------------------------------------


def test_a_passage_is_analyzed_with_its_context_and_stored_without_it(
    store: ContractStore,
) -> None:
    texts = ["The lamp turns every ten seconds.", "Its bulb is changed in spring."]
    contexts = ["Lighthouse keeping > Lamp", "Lighthouse keeping > Lamp"]
    vectors = unit_vectors(np.random.default_rng(3), 2)
    source, chunks = revision("light", "r1", vectors, texts=texts)
    chunks = [replace(c, context=x) for c, x in zip(chunks, contexts, strict=True)]
    store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
    put(store, "plain", "r1", ["A lighthouse warns ships."])
    grant = {"light": "r1", "plain": "r1"}

    hits = lexical(store, grant, "lighthouse bulb")
    analyzed = {
        "light": [f"{x}\n{t}" for x, t in zip(contexts, texts, strict=True)],
        "plain": ["A lighthouse warns ships."],
    }
    assert_ranked(hits, reference(analyzed, set(grant), "lighthouse bulb"))
    assert {h.chunk_id for h in hits} == {"light:0", "light:1", "plain:0"}
    # What is stored, searched densely and cited is the passage alone.
    assert {h.chunk_id: h.text for h in hits if h.source_id == "light"} == {
        "light:0": texts[0],
        "light:1": texts[1],
    }


def test_stored_descriptor_is_what_the_first_open_stored(harness: StoreHarness) -> None:
    store = harness.open()
    assert store.stored_descriptor("c1") is None
    store.open_corpus(descriptor("c1"))
    assert store.stored_descriptor("c1") == descriptor("c1").canonical_json()
    assert harness.open().stored_descriptor("c1") == descriptor("c1").canonical_json()
    assert store.stored_descriptor("c2") is None


# --- scoring named passages (hybrid fusion's other mode) --------------------------------------


def test_scores_of_named_passages_equal_what_the_searches_gave_them(store: ContractStore) -> None:
    grant = load(store)
    terms = query_terms("virus cells", DEFAULT_ANALYZER)
    query = unit_vectors(np.random.default_rng(7), 1)[0]
    everything = store.search("c1", "ns", grant, query, 100, CancelToken())
    assert len(everything) == sum(len(t) for t in DOCS.values())
    ranked = {h.chunk_id: h.score for h in lexical(store, grant, "virus cells", k=100)}
    dense = store.dense_scores("c1", "ns", everything, query, CancelToken())
    lexical_values = store.lexical_scores("c1", "ns", grant, everything, terms, CancelToken())
    assert None not in dense and None not in lexical_values
    np.testing.assert_allclose(np.array(dense), np.array([h.score for h in everything]), atol=1e-6)
    # A passage holding no query term scores 0 (the search leaves it out).
    expected = [ranked.get(h.chunk_id, 0.0) for h in everything]
    assert 0.0 in expected and len(ranked) >= 3
    np.testing.assert_allclose(np.array(lexical_values), np.array(expected), atol=1e-9)


def test_a_passage_not_held_at_its_revision_scores_none(store: ContractStore) -> None:
    grant = load(store)
    query = unit_vectors(np.random.default_rng(7), 1)[0]
    hits = store.search("c1", "ns", grant, query, 100, CancelToken())
    put(store, "heart", "r2", ["Heart cells again, rewritten."], expected="r1")
    elsewhere = replace(hits[0], chunk_id="no-such-passage")
    named = [*hits, elsewhere]
    dense = store.dense_scores("c1", "ns", named, query, CancelToken())
    lexical_values = store.lexical_scores(
        "c1",
        "ns",
        {**grant, "heart": "r2"},
        named,
        query_terms("heart cells", DEFAULT_ANALYZER),
        CancelToken(),
    )
    for values in (dense, lexical_values):
        gone = [h.source_id == "heart" for h in hits] + [True]
        assert [v is None for v in values] == gone
    # Another namespace holds none of them.
    assert store.dense_scores("c1", "other", hits, query, CancelToken()) == [None] * len(hits)
    assert store.lexical_scores(
        "c1", "other", grant, hits, query_terms("cells", DEFAULT_ANALYZER), CancelToken()
    ) == [None] * len(hits)
    assert store.dense_scores("c1", "ns", [], query, CancelToken()) == []


# --- statistics over the grant (no oracle for unreadable passages) ------------------------------

HIDDEN = ["Virus cells: a virus infects cells, and cells shed virus.", "Virus virus cells."]


def hybrid_lexical(
    store: ContractStore,
    allowed: dict[str, str],
    query: str,
    filters: MetadataFilter | None = None,
) -> dict[str, float | None]:
    """What hybrid fusion's lexical component gives every passage the dense search over this
    grant finds: `lexical_scores`, with the grant and filters of the request."""
    vector = unit_vectors(np.random.default_rng(7), 1)[0]
    dense = store.search("c1", "ns", allowed, vector, 100, CancelToken(), filters)
    values = store.lexical_scores(
        "c1", "ns", allowed, dense, query_terms(query, DEFAULT_ANALYZER), CancelToken(), filters
    )
    return {h.chunk_id: v for h, v in zip(dense, values, strict=True)}


Observed = tuple[list[tuple[str, float]], dict[str, float | None]]


def observed(store: ContractStore, allowed: dict[str, str], query: str) -> Observed:
    """The caller's lexical hits (chunk id, score) and hybrid's lexical component."""
    return (
        [(h.chunk_id, h.score) for h in lexical(store, allowed, query)],
        hybrid_lexical(store, allowed, query),
    )


@pytest.mark.parametrize("query", ["virus cells", "cells", "influenza virus"])
def test_a_source_the_caller_may_not_read_never_moves_its_scores(
    store: ContractStore, query: str
) -> None:
    grant = load(store)
    mine = {"cells": "r1", "virus": "r1"}
    before = observed(store, mine, query)
    assert before[0]  # the caller's own passages match
    assert_ranked(lexical(store, mine, query), reference(DOCS, set(mine), query))

    # A source it may not read, in the same namespace, full of the query's words.
    put(store, "hidden", "r1", HIDDEN)
    # Exactly equal, not close: the scores carry no trace of the hidden passages.
    assert observed(store, mine, query) == before
    # Whoever may read it sees its effect: the test could fail.
    everything = {**grant, "hidden": "r1"}
    with_hidden = lexical(store, everything, query)
    assert "hidden:0" in {h.chunk_id for h in with_hidden}
    assert_ranked(with_hidden, reference({**DOCS, "hidden": HIDDEN}, set(everything), query))

    # A new revision of it, then its delete, change nothing either.
    put(store, "hidden", "r2", HIDDEN[:1] * 5, expected="r1")
    assert observed(store, mine, query) == before
    store.delete_source("c1", "ns", "hidden", "r2")
    assert observed(store, mine, query) == before


def test_a_source_the_filters_leave_out_never_moves_the_scores(store: ContractStore) -> None:
    put(store, "cells", "r1", DOCS["cells"], metadata={"lang": "en"})
    put(store, "virus", "r1", DOCS["virus"], metadata={"lang": "en"})
    grant = {"cells": "r1", "virus": "r1", "hidden": "r1"}
    english = parse_filter({"lang": "en"})

    def seen() -> Observed:
        hits = lexical(store, grant, "virus cells", filters=english)
        return [(h.chunk_id, h.score) for h in hits], hybrid_lexical(
            store, grant, "virus cells", english
        )

    before = seen()
    put(store, "hidden", "r1", HIDDEN, metadata={"lang": "de"})
    assert seen() == before
    docs = {"cells": DOCS["cells"], "virus": DOCS["virus"]}
    hits = lexical(store, grant, "virus cells", filters=english)
    assert_ranked(hits, reference(docs, set(docs), "virus cells"))


@pytest.mark.parametrize(
    ("query", "pinned"),
    [
        (
            "virus cells",
            [
                ("virus:0", 0.7256949886584005),
                ("virus:2", 0.46863864692997054),
                ("virus:1", 0.44066022024758417),
                ("cells:0", 0.39247213158496713),
                ("cells:1", 0.39247213158496713),
                ("heart:0", 0.28941858395551395),
            ],
        ),
        ("blood blood heart", [("heart:0", 2.01221230039388), ("heart:1", 1.240032846274713)]),
    ],
)
def test_a_full_grant_scores_exactly_as_before(
    store: ContractStore, query: str, pinned: list[tuple[str, float]]
) -> None:
    # The scores both stores gave before statistics followed the grant (main at bde8536),
    # bit for bit: with the whole namespace granted, the grant's statistics are the
    # namespace's, so retrieval quality on a full grant is unchanged.
    grant = load(store)
    assert [(h.chunk_id, h.score) for h in lexical(store, grant, query)] == pinned
    scores = hybrid_lexical(store, grant, query)
    assert {cid: v for cid, v in scores.items() if v} == dict(pinned)


def test_scores_of_named_passages_follow_the_grant_and_filters(store: ContractStore) -> None:
    put(store, "cells", "r1", DOCS["cells"], metadata={"lang": "en"})
    put(store, "heart", "r1", DOCS["heart"], metadata={"lang": "de"})
    put(store, "virus", "r1", DOCS["virus"], metadata={"lang": "en"})
    put(store, "hidden", "r1", HIDDEN, metadata={"lang": "en"})
    everything = {"cells": "r1", "heart": "r1", "virus": "r1", "hidden": "r1"}
    vector = unit_vectors(np.random.default_rng(7), 1)[0]
    named = store.search("c1", "ns", everything, vector, 100, CancelToken())
    terms = query_terms("virus cells heart", DEFAULT_ANALYZER)
    for allowed, filters in [
        ({"cells": "r1", "virus": "r1"}, None),
        ({"cells": "r1", "heart": "r1", "virus": "r1"}, parse_filter({"lang": "en"})),
        ({"heart": "r1"}, None),
        (everything, None),
    ]:
        ranked = {
            h.chunk_id: h.score
            for h in store.lexical_search("c1", "ns", allowed, terms, 100, CancelToken(), filters)
        }
        values = store.lexical_scores("c1", "ns", allowed, named, terms, CancelToken(), filters)
        rankable = {
            h.chunk_id
            for h in store.search("c1", "ns", allowed, vector, 100, CancelToken(), filters)
        }
        # The search's own score, bit for bit; 0.0 for a rankable passage without a query
        # term; None for a passage that search could not rank (outside the grant or filters).
        assert values == [
            (ranked.get(h.chunk_id, 0.0) if h.chunk_id in rankable else None) for h in named
        ]
    assert store.lexical_scores("c1", "ns", {}, named, terms, CancelToken()) == [None] * len(named)


def test_both_stores_give_bit_equal_scores_under_any_grant(tmp_path: Path) -> None:
    stores = {kind: _open_store(kind, tmp_path / kind, 8192) for kind in STORE_KINDS}
    try:
        answers = {}
        for kind, store in stores.items():
            store.open_corpus(descriptor("c1"))
            everything = load(store)
            put(store, "hidden", "r1", HIDDEN, metadata={"lang": "de"})
            everything["hidden"] = "r1"
            vector = unit_vectors(np.random.default_rng(7), 1)[0]
            named = store.search("c1", "ns", everything, vector, 100, CancelToken())
            seen = []
            for allowed, filters in [
                (everything, None),
                ({"cells": "r1", "virus": "r1"}, None),
                ({"heart": "r1", "hidden": "r1"}, None),
                (everything, parse_filter({"lang": "de"})),
            ]:
                for query in ("virus cells", "blood heart cells", "virus virus cell"):
                    terms = query_terms(query, DEFAULT_ANALYZER)
                    hits = store.lexical_search(
                        "c1", "ns", allowed, terms, 100, CancelToken(), filters
                    )
                    values = store.lexical_scores(
                        "c1", "ns", allowed, named, terms, CancelToken(), filters
                    )
                    seen.append(([(h.chunk_id, h.score) for h in hits], values))
            answers[kind] = seen
        assert answers["sqlite"] == answers["pgvector"]
    finally:
        for store in stores.values():
            store.close()


def test_a_repeated_grant_sees_the_statistics_of_its_sources_as_they_change(
    store: ContractStore,
) -> None:
    # The SQLite store keeps a grant's statistics with its rows: a write must drop them.
    put(store, "cells", "r1", DOCS["cells"])
    grant = {"cells": "r1", "virus": "r1"}  # "virus" is not stored yet
    assert_ranked(lexical(store, grant, "cells"), reference(DOCS, {"cells"}, "cells"))
    put(store, "virus", "r1", DOCS["virus"])
    assert_ranked(lexical(store, grant, "cells"), reference(DOCS, set(grant), "cells"))
    store.delete_source("c1", "ns", "virus", "r1")
    assert_ranked(lexical(store, grant, "cells"), reference(DOCS, {"cells"}, "cells"))

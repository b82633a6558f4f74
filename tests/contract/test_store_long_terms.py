"""Words too long for a btree index row, over every store (probe "parity", session 44).

A passage holding one long word that does not compress (a hex dump, a base64 blob) was indexed
by SQLite but refused by PostgreSQL (`index row size 3032 exceeds btree version 4 maximum 2704
for index "chunk_terms_pkey"`), answered 503 `connection` every time, and the two stores then
held different sources. PostgreSQL now keeps such a term under a key (`postgres.lexical.
term_key`): both stores index the passage, find it by its long word and its ordinary ones, and
score it alike, bit for bit.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms, term_frequencies
from retrieval_host.core.ports import Candidate, CapacityLimits
from tests.contract.conftest import STORE_KINDS, ContractStore, _open_store
from tests.support.lexical_reference import reference
from tests.support.sqlite_store import descriptor, revision, unit_vectors

_RNG = random.Random(44)
# 2,800 hex digits (random: pglz cannot compress them), as in the probe's repro.
HEX = _RNG.randbytes(1400).hex()
# 1,000 Thai consonants: one word of 3,000 bytes of UTF-8.
THAI = "".join(_RNG.choice("กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอ") for _ in range(1000))
# Another long word with the same first 2,799 digits: found by nothing stored.
NEAR_HEX = HEX[:-1] + ("0" if HEX[-1] != "0" else "1")

DOCS = {
    "dump": [
        f"Report of the run. The payload was {HEX} as received.",
        f"The payload was {HEX} again, and {THAI} with it.",
    ],
    "plain": ["The payload was received in full.", "Nothing unusual in the report."],
    "other": ["A report on otters and kelp."],
}
QUERIES = [HEX, THAI, "payload", f"payload {HEX} report", f"{HEX} {HEX} {THAI}", NEAR_HEX]


def _load(store: ContractStore) -> dict[str, str]:
    store.open_corpus(descriptor("c1"))
    for sid, texts in DOCS.items():
        vectors = unit_vectors(np.random.default_rng(len(texts)), len(texts))
        source, chunks = revision(sid, "r1", vectors, texts=texts)
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
    return {sid: "r1" for sid in DOCS}


def _search(store: ContractStore, allowed: dict[str, str], query: str) -> list[Candidate]:
    terms = query_terms(query, DEFAULT_ANALYZER)
    return store.lexical_search("c1", "ns", allowed, terms, 10, CancelToken())


def test_the_long_words_are_single_terms_longer_than_a_btree_row() -> None:
    # What the other tests rely on: each long word is one term, past PostgreSQL's 2,704 bytes.
    terms = term_frequencies(DOCS["dump"][1], DEFAULT_ANALYZER)
    assert terms[HEX] == 1 and terms[THAI] == 1
    assert len(HEX.encode()) == 2800 and len(THAI.encode()) == 3000


def test_a_passage_holding_a_word_too_long_for_an_index_row_is_found_by_it(
    store: ContractStore,
) -> None:
    grant = _load(store)
    hits = _search(store, grant, HEX)
    assert sorted(h.chunk_id for h in hits) == ["dump:0", "dump:1"]
    assert [h.chunk_id for h in _search(store, grant, THAI)] == ["dump:1"]
    assert _search(store, grant, NEAR_HEX) == []  # only the very word, not its first digits
    for query in QUERIES:
        expected = reference(DOCS, set(grant), query)
        got = _search(store, grant, query)
        assert [h.chunk_id for h in got] == [cid for cid, _ in expected], query[:40]
        np.testing.assert_allclose([h.score for h in got], [s for _, s in expected], atol=1e-9)


def test_both_stores_score_passages_with_long_words_bit_equal(tmp_path: Path) -> None:
    stores = {kind: _open_store(kind, tmp_path / kind, 8192) for kind in STORE_KINDS}
    try:
        answers = {}
        for kind, store in stores.items():
            everything = _load(store)
            named = [
                h for query in ("payload report", HEX) for h in _search(store, everything, query)
            ]
            seen = []
            # The whole namespace, most of it (counted as the rest subtracted), a small part.
            for allowed in (everything, {"dump": "r1", "plain": "r1"}, {"dump": "r1"}):
                for query in QUERIES:
                    terms = query_terms(query, DEFAULT_ANALYZER)
                    hits = store.lexical_search("c1", "ns", allowed, terms, 10, CancelToken())
                    values = store.lexical_scores("c1", "ns", allowed, named, terms, CancelToken())
                    seen.append(([(h.chunk_id, h.score) for h in hits], values))
            answers[kind] = seen
        assert any(hits for hits, _ in answers["sqlite"])
        assert answers["sqlite"] == answers["pgvector"]
    finally:
        for store in stores.values():
            store.close()

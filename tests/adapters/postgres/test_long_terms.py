"""Long terms in the PostgreSQL store's lexical index (`postgres.lexical.term_key`).

A term over 1,024 bytes is stored under a key since probe "parity" (session 44). Rows written
before hold such a term as itself when it fitted the btree (up to about 2,680 bytes, or longer
compressed): a search must still find them, and count them with the keyed rows.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
from psycopg import sql

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.adapters.postgres.lexical import TERM_KEY_BYTES, term_key
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.support.pg import connect
from tests.support.sqlite_store import descriptor, revision, unit_vectors

# 2,000 hex digits: over `TERM_KEY_BYTES`, yet a btree row held it as itself before keys.
WORD = random.Random(1024).randbytes(1000).hex()
DOCS = {
    "old": [f"The dump {WORD} of the first run.", "Nothing else."],
    "new": [f"The dump {WORD} again.", "Kelp and otters."],
    "more": ["A dump of nothing.", "Rocks and stones."],
}


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PgVectorStore]:
    opened = PgVectorStore.open(pg_dsn, schema=pg_schema)
    opened.open_corpus(descriptor("c1"))
    for sid, texts in DOCS.items():
        vectors = unit_vectors(np.random.default_rng(2), len(texts))
        source, chunks = revision(sid, "r1", vectors, texts=texts)
        opened.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
    yield opened
    opened.close()


def _ranked(store: PgVectorStore, allowed: dict[str, str], query: str) -> list[tuple[str, float]]:
    terms = query_terms(query, DEFAULT_ANALYZER)
    return [
        (h.chunk_id, h.score)
        for h in store.lexical_search("c1", "ns", allowed, terms, 10, CancelToken())
    ]


def test_a_term_up_to_1024_bytes_is_its_own_key_and_a_longer_one_a_shorter_key() -> None:
    fits = "é" * (TERM_KEY_BYTES // 2)  # 1,024 bytes in 512 characters
    assert term_key(fits) == fits
    key = term_key(fits + "e")
    assert key.startswith(fits[:200] + " ") and len(key.encode()) == 400 + 1 + 64
    assert term_key(WORD) != term_key(WORD[:-1] + "x")


def test_a_long_term_stored_as_itself_before_keys_is_still_found_and_counted(
    store: PgVectorStore, pg_dsn: str, pg_schema: str
) -> None:
    everything = {sid: "r1" for sid in DOCS}
    some = {"old": "r1", "new": "r1"}
    queries = [WORD, f"dump {WORD}"]
    before = [_ranked(store, grant, q) for grant in (everything, some) for q in queries]
    assert [cid for cid, _ in before[0]] == ["new:0", "old:0"]
    # Rewrite the old source's row as a release before keys wrote it: the term as itself.
    with connect(pg_dsn) as conn:
        changed = conn.execute(
            sql.SQL(
                "UPDATE {s}.chunk_terms SET term = %s WHERE term = %s AND chunk_pk = "
                "(SELECT id FROM {s}.chunks WHERE chunk_id = 'old:0')"
            ).format(s=sql.Identifier(pg_schema)),
            (WORD, term_key(WORD)),
        ).rowcount
    assert changed == 1
    # Both passages found, df counted over both forms: the very same scores.
    assert [_ranked(store, grant, q) for grant in (everything, some) for q in queries] == before

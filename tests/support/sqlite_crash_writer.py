"""Child process of the SQLite crash test: replaces source revisions until it is killed.

Run as `python -m tests.support.sqlite_crash_writer DB_PATH FIRST_ROUND`. Each round gives every
source a new revision `g<round>` whose passage count and texts are derived from the revision,
so a reader can tell a complete revision from a torn one. After each commit it writes
`<source> <revision>` on stdout, which the parent reads to know it is making progress.
"""

from __future__ import annotations

import sys
import zlib

import numpy as np

from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, revision_text, unit_vectors

CORPUS = "crash"
NAMESPACE = "ns"
SOURCES = ("alpha", "beta", "gamma", "delta")
DIM = 32


def chunk_count(source_id: str, rev: str) -> int:
    """How many passages revision `rev` of a source has (1..160, varies per revision)."""
    return 1 + zlib.crc32(f"{source_id}/{rev}".encode()) % 160


def expected_texts(source_id: str, rev: str) -> list[str]:
    n = chunk_count(source_id, rev)
    return [revision_text(source_id, rev, i, n) for i in range(n)]


def main(argv: list[str]) -> int:
    path, first_round = argv[1], int(argv[2])
    store = SqliteVectorStore.open(path)
    store.open_corpus(descriptor(CORPUS, dimensions=DIM))
    rng = np.random.default_rng(first_round)
    limits = CapacityLimits()
    round_number = first_round
    while True:
        for source_id in SOURCES:
            current = store.get_source(CORPUS, NAMESPACE, source_id)
            rev = f"g{round_number}"
            vectors = unit_vectors(rng, chunk_count(source_id, rev), DIM)
            source, chunks = revision(source_id, rev, vectors, texts=expected_texts(source_id, rev))
            store.replace_source(
                CORPUS,
                NAMESPACE,
                source,
                chunks,
                expected_revision=current.revision if current is not None else None,
                limits=limits,
            )
            sys.stdout.write(f"{source_id} {rev}\n")
            sys.stdout.flush()
        round_number += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

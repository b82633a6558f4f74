"""Child process of the racing-index tests: one `index_context` of source `doc` at `r1`.

Run as `python -m tests.support.racing_indexer sqlite PATH TAG` or
`python -m tests.support.racing_indexer pgvector DSN SCHEMA TAG`. The passages' text is derived
from TAG (equal tags: identical content). The embedding step is a gate: the child writes
`embedding` on stdout and waits for a line on stdin, so the parent can hold every writer after
it has read the current revision and release them together (they then race on the commit). At
the end it writes one line: `result <status>` or `error <code> <reason>`.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Sequence

import numpy as np

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import (
    ChunkInput,
    EmbeddingUsage,
    IndexRequest,
    Location,
    SourceInfo,
)
from retrieval_host.core.ports import (
    ANY_REVISION,
    AuthorizationRequest,
    EmbeddingBatch,
    Grant,
    VectorStore,
)
from retrieval_host.core.service import Corpus, RetrievalService

CORPUS = "race"
NAMESPACE = "team"
SOURCE = "doc"
REVISION = "r1"
DIM = 8


class GatedEmbedding:
    """Deterministic vectors from each text's CRC, after the parent opens the gate."""

    descriptor = EmbeddingDescriptor("gated", "test", "none", "none", "crc-vectors", DIM)
    max_input_tokens = 256

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [1 for _ in texts]

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        sys.stdout.write("embedding\n")
        sys.stdout.flush()
        if not sys.stdin.readline():
            raise SystemExit("the parent went away")
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(DIM) for t in texts]
        vectors = np.array(rows, dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return EmbeddingBatch(vectors, EmbeddingUsage(requests=1, input_tokens=len(texts)))


def request(tag: str) -> IndexRequest:
    texts = [f"Passage {i} of the {tag} edition." for i in range(3)]
    return IndexRequest(
        CORPUS,
        SourceInfo(SOURCE, REVISION, "Doc"),
        [
            ChunkInput(f"doc-{i}", t, Location(page=1, start_line=i + 1, end_line=i + 1))
            for i, t in enumerate(texts)
        ],
    )


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    return Grant(NAMESPACE, {SOURCE: ANY_REVISION})


def open_store(argv: list[str]) -> VectorStore:
    if argv[0] == "sqlite":
        from retrieval_host.adapters.sqlite import SqliteVectorStore

        return SqliteVectorStore.open(argv[1])
    from retrieval_host.adapters.postgres import PgVectorStore

    return PgVectorStore.open(argv[1], schema=argv[2])


def corpus(store: VectorStore) -> Corpus:
    return Corpus(CORPUS, "passages-v1", GatedEmbedding(), store, authorize)


def main(argv: list[str]) -> int:
    store = open_store(argv[:-1])
    try:
        service = RetrievalService([corpus(store)])
        try:
            result = service.index_context(request(argv[-1]), RequestContext(subject="bulk"))
        except RetrievalError as exc:
            sys.stdout.write(f"error {exc.code.value} {exc.reason}\n")
        else:
            sys.stdout.write(f"result {result.status}\n")
        sys.stdout.flush()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The application factory the HTTP benchmark's host runs: `bench._http_app:create_driver`.

BENCH ONLY. The corpus holds synthetic vectors, so queries cannot be embedded by a model:
`QueryTable` is an embedding adapter that returns precomputed vectors for the benchmark's
known query strings (`q0`, `q1`, ...) and refuses anything else. Everything else is the
product: the SQLite store, the retrieval service, the driver and the HTTPS host.

`applicationOptions`: `queries` (a .npy file of query vectors, row i for `q{i}`) and `grants`
(a JSON object: subject -> list of source ids it may search, all at revision `r1`);
optionally `grantCacheBytes`, the SQLite store's grant cache budget (0 turns it off), and
`textQueries: true`: any other query text is embedded by the real local model (the product's
adapter, 384 dimensions like the synthetic vectors). Its vectors are then searched among the
synthetic ones: the ranking means nothing, the cost of a text query (embedding, micro-batching,
the query-vector cache, the search) is real. `graphFor: SUBJECT` gets the store's
approximate search graph before the host serves, by searching once with that subject's grant
(every source) and waiting: what a host does after its first such search (a worker maps the
graph file another process wrote for the same snapshot, or builds and writes it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

import numpy as np

from bench._common import NAMESPACE, REVISION, Matrix, descriptor
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.adapters.wiring import build_vector_store
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import (
    AuthorizationRequest,
    EmbeddingAdapter,
    EmbeddingBatch,
    Grant,
    VectorStore,
)
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.settings import HostSettings


class QueryTable:
    """BENCH-ONLY embedding adapter: precomputed vectors for the strings `q0`, `q1`, ...

    Its descriptor is the synthetic corpus's, so the store accepts it.
    """

    def __init__(self, vectors: Matrix, model: EmbeddingAdapter | None = None) -> None:
        self._vectors = vectors
        self._model = model  # embeds any other text (`textQueries`), else such text is refused
        self._descriptor = descriptor(vectors.shape[1]).embedding

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self._descriptor

    @property
    def max_input_tokens(self) -> int:
        return 256

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [1 for _ in texts]

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        rows: list[int] = []
        other: list[int] = []
        for at, text in enumerate(texts):
            number = int(text[1:]) if text[:1] == "q" and text[1:].isdigit() else -1
            if not 0 <= number < len(self._vectors):
                if self._model is None:
                    raise RetrievalError(ErrorCode.EMBEDDING_FAILED, "not a benchmark query.")
                other.append(at)
            rows.append(max(number, 0))
        vectors = self._vectors[rows]
        if other:
            assert self._model is not None
            embedded = self._model.embed([texts[at] for at in other], cancel)
            vectors[other] = embedded.vectors
        return EmbeddingBatch(vectors, EmbeddingUsage(requests=1, input_tokens=len(texts)))


class TableAuthorizer:
    """Search grants from a fixed table: subject -> the sources it may read at `r1`."""

    def __init__(self, grants: Mapping[str, Sequence[str]]) -> None:
        self._grants = {
            subject: Grant(NAMESPACE, {sid: REVISION for sid in sources})
            for subject, sources in grants.items()
        }

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        grant = self._grants.get(context.subject)
        if request.operation != "search" or grant is None:
            return None
        if request.source_ids is None:
            return grant
        return Grant(
            NAMESPACE, {s: grant.sources[s] for s in request.source_ids if s in grant.sources}
        )


def prebuild_graph(store: SqliteVectorStore, sources: Sequence[str], query: Matrix) -> float:
    """Search once with this grant (every source: the store asks for an approximate graph)
    and wait for the graph, before the host serves; the seconds the build took."""
    started = time.perf_counter()
    store.open_corpus(descriptor())
    allowed = {sid: REVISION for sid in sources}
    store.search(descriptor().corpus_id, NAMESPACE, allowed, query, 1, CancelToken())
    store.wait_for_graphs()
    return time.perf_counter() - started


def create_driver(settings: HostSettings, environ: Mapping[str, str] | None = None) -> Driver:
    """The benchmark host's driver: one corpus `bench` over the configured SQLite store."""
    options = settings.application_options
    vectors = np.load(settings.path(str(options["queries"]))).astype(np.float32)
    grants = json.loads(settings.path(str(options["grants"])).read_text())
    store: VectorStore
    if "grantCacheBytes" in options and settings.store.sqlite_path is not None:
        # The same SQLite store with the grant cache sized (0: off), for a comparison run.
        store = SqliteVectorStore.open(
            settings.path(settings.store.sqlite_path),
            grant_cache_bytes=int(str(options["grantCacheBytes"])),
        )
    else:
        store = build_vector_store(settings, environ or {})
    graph_for = options.get("graphFor")
    if isinstance(graph_for, str) and isinstance(store, SqliteVectorStore):
        prebuild_graph(store, grants[graph_for], vectors[0])
    model: EmbeddingAdapter | None = None
    if options.get("textQueries") is True:
        from retrieval_host.adapters.embedding_local import LocalEmbedding

        model = LocalEmbedding()
    corpus = Corpus(
        id="bench",
        version="bench-v1",
        embedding=QueryTable(vectors, model),
        store=store,
        authorize=TableAuthorizer(grants),
    )
    return Driver(RetrievalService([corpus]))

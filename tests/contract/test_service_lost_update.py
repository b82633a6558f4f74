"""An index whose source changes while it embeds loses with a typed conflict, even when the
change brought the label it read back (SPEC 3.3: "never a silent overwrite").

A black-box probe (finding W-2): writer W reads source `a` at `r1` (content P) and embeds `r2`
for ~10 s; meanwhile another client deletes `r1` and indexes `r1` again with content Q (or
indexes `r3`, then `r1` with Q), and both are acknowledged. W's commit then replaced Q with no
error, answering `replacedRevision: "r1"` as if it had replaced the P it read. Here the other
client's writes run inside W's embedding step (a one-shot hook), through another service on
another connection to the same database, so the interleaving is forced, not waited for.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.fingerprint import joined_text, revision_fingerprint, sha256_text
from retrieval_host.core.models import (
    ChunkInput,
    DeleteRequest,
    EmbeddingUsage,
    IndexRequest,
    IndexResult,
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
from retrieval_host.wire.retrieval import index_response
from tests.contract.conftest import StoreHarness

CORPUS = "docs"
NAMESPACE = "team"
DIM = 8


@dataclass
class HookedEmbedding:
    """Deterministic vectors from each text's CRC; `during`, when set, runs once inside the
    next embedding call (after the writer read the source, before its commit)."""

    descriptor = EmbeddingDescriptor("hooked", "test", "none", "none", "crc-vectors", DIM)
    max_input_tokens = 256
    during: Callable[[], None] | None = None
    calls: int = 0

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [1 for _ in texts]

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        self.calls += 1
        hook, self.during = self.during, None
        if hook is not None:
            hook()
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(DIM) for t in texts]
        vectors = np.array(rows, dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return EmbeddingBatch(vectors, EmbeddingUsage(requests=1, input_tokens=len(texts)))


@dataclass
class StoreAcl:
    """Index: any revision; delete: the store's current revision."""

    store: VectorStore

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        ids = request.source_ids
        if request.operation == "index":
            return Grant(NAMESPACE, {sid: ANY_REVISION for sid in ids or ()})
        return Grant(NAMESPACE, self.store.current_revisions(CORPUS, NAMESPACE, ids))


def request(revision: str, content: str) -> IndexRequest:
    texts = [f"Passage {i} of edition {content}." for i in range(3)]
    return IndexRequest(
        CORPUS,
        SourceInfo("a", revision, "A"),
        [ChunkInput(f"a-{i}", t, Location(start_line=i + 1)) for i, t in enumerate(texts)],
    )


def fingerprint(revision: str, content: str) -> str:
    r = request(revision, content)
    return revision_fingerprint(r.source, r.chunks, sha256_text(joined_text(r.chunks)))


@dataclass
class World:
    store: VectorStore
    embedding: HookedEmbedding
    writer: RetrievalService  # W, the slow writer
    other: RetrievalService  # the client that writes while W embeds
    acknowledged: list[IndexResult] = field(default_factory=list)

    def index(self, revision: str, content: str) -> IndexResult:
        return self.writer.index_context(request(revision, content), RequestContext("w"))

    def other_index(self, revision: str, content: str) -> None:
        result = self.other.index_context(request(revision, content), RequestContext("o"))
        self.acknowledged.append(result)

    def other_delete(self, revision: str) -> None:
        self.other.delete_context(DeleteRequest(CORPUS, "a", revision), RequestContext("o"))

    def stored(self) -> tuple[str, str]:
        source = self.store.get_source(CORPUS, NAMESPACE, "a")
        assert source is not None
        return source.revision, source.fingerprint


@pytest.fixture
def world(harness: StoreHarness) -> World:
    store, other_store = harness.open(), harness.open()
    embedding = HookedEmbedding()
    writer = RetrievalService([Corpus(CORPUS, "passages-v1", embedding, store, StoreAcl(store))])
    other = RetrievalService(
        [Corpus(CORPUS, "passages-v1", HookedEmbedding(), other_store, StoreAcl(other_store))]
    )
    w = World(store, embedding, writer, other)
    assert w.index("r1", "P").status == "indexed"
    return w


def expect_concurrent_writer(call: Callable[[], object]) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        call()
    assert (excinfo.value.code, excinfo.value.reason) == (
        ErrorCode.SOURCE_CONFLICT,
        "concurrent-writer",
    )


# --- a label that came back while the writer embedded ----------------------------------------


def test_a_source_deleted_and_re_created_at_the_same_label_refuses_the_slow_writer(
    world: World,
) -> None:
    def meanwhile() -> None:
        world.other_delete("r1")
        world.other_index("r1", "Q")

    world.embedding.during = meanwhile
    expect_concurrent_writer(lambda: world.index("r2", "R"))
    assert world.embedding.during is None  # the hook ran, inside W's embedding
    assert [r.status for r in world.acknowledged] == ["indexed"]
    assert world.stored() == ("r1", fingerprint("r1", "Q"))


def test_a_source_rolled_back_to_the_read_label_refuses_the_slow_writer(world: World) -> None:
    def meanwhile() -> None:
        world.other_index("r3", "P")
        world.other_index("r1", "Q")

    world.embedding.during = meanwhile
    expect_concurrent_writer(lambda: world.index("r2", "R"))
    assert [(r.status, r.replaced_revision) for r in world.acknowledged] == [
        ("indexed", "r1"),
        ("indexed", "r3"),
    ]
    assert world.stored() == ("r1", fingerprint("r1", "Q"))


# --- the ordinary cases ----------------------------------------------------------------------


def test_an_unchanged_resend_is_unchanged_without_embedding(world: World) -> None:
    calls = world.embedding.calls
    result = world.index("r1", "P")
    assert (result.status, result.replaced_revision) == ("unchanged", None)
    assert world.embedding.calls == calls
    assert world.stored() == ("r1", fingerprint("r1", "P"))


def test_a_replace_answers_the_revision_it_replaced_as_a_plain_label(world: World) -> None:
    result = world.index("r2", "R")
    assert (result.status, result.replaced_revision) == ("indexed", "r1")
    assert world.stored() == ("r2", fingerprint("r2", "R"))
    wire = index_response(result).model_dump(by_alias=True)
    assert wire["replacedRevision"] == "r1" and type(wire["replacedRevision"]) is str
    assert world.index("r3", "S").replaced_revision == "r2"


def test_a_new_label_committed_while_the_writer_embedded_refuses_it_as_before(
    world: World,
) -> None:
    world.embedding.during = lambda: world.other_index("r3", "P")

    expect_concurrent_writer(lambda: world.index("r2", "R"))
    assert world.stored() == ("r3", fingerprint("r3", "P"))


def test_the_same_revision_and_content_committed_meanwhile_is_unchanged(world: World) -> None:
    """The racing bulk ingest of one file (issue 13): still `unchanged`, not a conflict."""
    world.embedding.during = lambda: world.other_index("r2", "R")

    result = world.index("r2", "R")
    assert (result.status, result.replaced_revision) == ("unchanged", None)
    assert world.stored() == ("r2", fingerprint("r2", "R"))

"""The read behind a saved citation (`get_passage`) while its source is replaced: a chunk id
both revisions hold answers the old revision's passage or the new one's, never
`SOURCE_UNAVAILABLE` (probe "consist", session 43: 116 of 2,793 such reads answered 404 on
SQLite, 34 of 1,254 on PostgreSQL, under ~3 replaces a second). The interleaving is forced as
in `test_service_replacing`, whose authorizer and writer these tests share; here a revision's
chunks keep their ids from one revision to the next, as an application naming its own chunks
does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.grants import GRANT_ATTEMPTS
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from tests.contract.conftest import StoreHarness
from tests.contract.test_service_replacing import CORPUS, World, opened_world, texts


class SameIds(World):
    """Each revision of a source holds chunks `<source>-0`, `<source>-1`."""

    def index(self, source_id: str, revision: str) -> None:
        chunks = [
            ChunkInput(f"{source_id}-{i}", text, Location(start_line=i + 1))
            for i, text in enumerate(texts(source_id, revision))
        ]
        request = IndexRequest(CORPUS, SourceInfo(source_id, revision, title=source_id), chunks)
        self.writing.index_context(request, RequestContext("writer"))

    def passage(self, revision: str | None = None) -> tuple[str, str]:
        """(revision, text) of chunk `a-0` as the citation read answers it."""
        found = self.service.get_passage(CORPUS, "a-0", self.context(), revision=revision)
        return found.source.revision, found.text


@pytest.fixture(params=["same-store", "other-connection"])
def world(
    request: pytest.FixtureRequest, harness: StoreHarness, local_embedding: LocalEmbedding
) -> Iterator[SameIds]:
    with opened_world(str(request.param), harness, local_embedding, SameIds, "a") as w:
        yield w


def _unavailable(world: SameIds, revision: str | None = None) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        world.passage(revision)
    assert excinfo.value.code is ErrorCode.SOURCE_UNAVAILABLE


def test_a_passage_whose_source_was_replaced_after_its_grant_is_read_at_the_new_revision(
    world: SameIds,
) -> None:
    # Granted r1; the store holds the chunk at r2 when it is read.
    world.acl.after = world.replace_at(1, "a", "r2")
    assert world.passage() == ("r2", texts("a", "r2")[0])
    assert world.acl.searches == 3  # the grant, the grant again, the check after the read


def test_a_passage_whose_source_was_replaced_after_the_read_is_read_again(
    world: SameIds,
) -> None:
    # The read found r1's passage; the check after it grants r2 only.
    world.acl.before = world.replace_at(2, "a", "r2")
    assert world.passage() == ("r2", texts("a", "r2")[0])
    assert world.acl.searches == 4


def test_a_citation_s_revision_replaced_after_its_grant_is_unavailable_on_the_new_read(
    world: SameIds,
) -> None:
    # Asked at r1, the citation's revision: read again, r2 is not it.
    world.acl.after = world.replace_at(1, "a", "r2")
    _unavailable(world, "r1")
    assert world.acl.searches == 2


def test_a_passage_deleted_after_its_grant_is_unavailable_without_asking_again(
    world: SameIds,
) -> None:
    world.acl.after = world.delete_at(1, "a", "r1")
    _unavailable(world)
    assert world.acl.searches == 1


def test_replacements_that_never_stop_end_a_passage_read_after_three_reads(
    world: SameIds,
) -> None:
    world.acl.after = world.replace_every_time("a")
    _unavailable(world)
    assert world.acl.searches == GRANT_ATTEMPTS


def test_an_authorizer_that_keeps_granting_a_replaced_revision_is_asked_once_more_only(
    world: SameIds,
) -> None:
    world.index("a", "r2")
    world.acl.pinned = {"a": "r1"}
    _unavailable(world)
    assert world.acl.searches == 2

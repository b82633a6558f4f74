"""Inspection through the client, sync and async: list corpora, iterate sources across pages,
show a source, open a citation, delete by the listed revision."""

from __future__ import annotations

import pytest
from pydantic import JsonValue

from retrieval_host.core.validation import MAX_METADATA_DEPTH
from retrieval_host_client import (
    ChunkInput,
    IndexRequest,
    InvalidRequestError,
    PermissionDeniedError,
    SourceInput,
    SourceUnavailableError,
)
from tests.client.conftest import Connect
from tests.client.modes import ClientApi
from tests.support.host import CORPUS, HANDBOOK


def test_list_inspect_navigate_and_delete_by_the_listed_revision(api: ClientApi, mode: str) -> None:
    prefix = f"inspect-{mode}/"  # ids holding `/`, as file paths do
    for name, texts in (("a.md", ["Alpha one.", "Alpha two.", "Alpha three."]), ("b.md", ["B."])):
        api.index_context(
            IndexRequest(
                corpus=CORPUS,
                source=SourceInput(id=prefix + name, revision="v1", title=name),
                chunks=tuple(
                    ChunkInput(id=f"{prefix}{name}#{i}", text=t) for i, t in enumerate(texts)
                ),
            )
        )
    [corpus] = [c for c in api.list_corpora() if c.id == CORPUS]
    assert corpus.operations == ["search", "index", "delete"]
    assert corpus.sources >= 4 and corpus.passages >= len(HANDBOOK) + 4

    listed = list(api.list_sources(CORPUS, page_size=1))
    ids = [s.id for s in listed]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    mine = [s for s in listed if s.id.startswith(prefix)]
    assert [(s.id, s.revision, s.chunk_count) for s in mine] == [
        (prefix + "a.md", "v1", 3),
        (prefix + "b.md", "v1", 1),
    ]

    shown = api.get_source(CORPUS, prefix + "a.md", limit=2)
    assert [p.chunk_id for p in shown.passages] == [f"{prefix}a.md#0", f"{prefix}a.md#1"]
    assert shown.next_cursor is not None
    rest = api.get_source(CORPUS, prefix + "a.md", limit=2, cursor=shown.next_cursor)
    assert [p.chunk_id for p in rest.passages] == [f"{prefix}a.md#2"]
    assert rest.next_cursor is None

    hit = api.search_context(corpus=CORPUS, query="Alpha two", source_ids=[prefix + "a.md"]).hits[0]
    cited = api.get_passage(CORPUS, hit.chunk_id)
    assert (cited.text, cited.source, cited.location) == (hit.text, hit.source, hit.location)

    for source in mine:
        api.delete_context(corpus=CORPUS, source_id=source.id, revision=source.revision)
    assert not [s for s in api.list_sources(CORPUS) if s.id.startswith(prefix)]
    with pytest.raises(SourceUnavailableError):
        api.get_passage(CORPUS, hit.chunk_id)


def test_a_missing_and_an_unauthorized_source_raise_the_same_error(connect: Connect) -> None:
    alice = connect("alice")
    assert [s.id for s in alice.list_sources(CORPUS)] == ["handbook"]
    errors = []
    for work in (
        lambda: alice.get_source(CORPUS, "secret"),
        lambda: alice.get_source(CORPUS, "no-such-source"),
        lambda: alice.get_passage(CORPUS, "secret-0"),
        lambda: alice.get_passage(CORPUS, "no-such-chunk"),
    ):
        with pytest.raises(SourceUnavailableError) as caught:
            work()
        assert caught.value.problem is not None
        errors.append(caught.value.problem.detail)
    assert len(set(errors)) == 1
    with pytest.raises(PermissionDeniedError):
        connect("bob").get_source(CORPUS, "handbook")
    assert connect("bob").list_corpora() == []
    assert connect("bob").list_write_only_corpora() == []
    # A writer's token: no corpus to search, but where it may write (it learned nothing).
    scribe = connect("scribe")
    assert scribe.list_corpora() == []
    assert [(c.id, c.operations) for c in scribe.list_write_only_corpora()] == [(CORPUS, ["index"])]


def test_bad_limits_and_cursors_are_typed_errors(api: ClientApi) -> None:
    with pytest.raises(ValueError, match="limit"):
        list(api.list_sources(CORPUS, page_size=1001))  # refused before sending
    with pytest.raises(InvalidRequestError) as caught:
        api.get_source(CORPUS, "handbook", cursor="00ff")
    assert (caught.value.status, caught.value.problem.reason) == (400, "invalid-cursor")  # type: ignore[union-attr]


def test_a_source_listing_keeps_what_its_title_and_media_type_filters_say(
    api: ClientApi, mode: str
) -> None:
    prefix = f"filter-{mode}/"
    titles = {"a": "Quarterly REPORT", "b": "Minutes", "c": "Annual report 2026", "d": "Notes"}
    for key, title in titles.items():
        api.index_context(
            IndexRequest(
                corpus=CORPUS,
                source=SourceInput(id=prefix + key, revision="v1", title=title),
                chunks=(ChunkInput(id=f"{prefix}{key}#0", text=f"{title} text."),),
            )
        )
    # Across pages of one: the cursor resumes after the last source read, not the last kept.
    kept = list(api.list_sources(CORPUS, page_size=1, title="report"))
    assert [s.id for s in kept if s.id.startswith(prefix)] == [prefix + "a", prefix + "c"]
    assert all("report" in s.title.lower() for s in kept)
    # Prepared passages record no media type: a media type filter keeps none of them.
    typed = list(api.list_sources(CORPUS, media_type="text/markdown"))
    assert not [s for s in typed if s.id.startswith(prefix)]
    with pytest.raises(InvalidRequestError):
        list(api.list_sources(CORPUS, title="x" * 257))
    for key in titles:
        api.delete_context(corpus=CORPUS, source_id=prefix + key, revision="v1")


@pytest.mark.parametrize("dots", [".", ".."])
def test_ids_that_are_dot_segments_reach_their_source_and_passage(
    api: ClientApi, dots: str
) -> None:
    # A black-box test: `.` and `..` are legal ids, indexed and listed, but URL resolution
    # removed them from the path and the client reached another route.
    api.index_context(
        IndexRequest(
            corpus=CORPUS,
            source=SourceInput(id=dots, revision="v1", title="Dots"),
            chunks=(ChunkInput(id=dots, text="The dotted source says hello."),),
        )
    )
    try:
        shown = api.get_source(CORPUS, dots)
        assert shown.source.id == dots
        assert [p.chunk_id for p in shown.passages] == [dots]
        assert api.get_passage(CORPUS, dots).text == "The dotted source says hello."
    finally:
        api.delete_context(corpus=CORPUS, source_id=dots, revision="v1")
    with pytest.raises(SourceUnavailableError):
        api.get_source(CORPUS, dots)


def test_a_citation_pinned_to_its_revision_refuses_a_reused_chunk_id(
    api: ClientApi, mode: str
) -> None:
    # A black-box test: a saved citation opened another revision's text when the new
    # revision of a prepared source reused the chunk id.
    source, chunk = f"pinned-{mode}", f"pinned-{mode}-c1"

    def index(revision: str, text: str) -> None:
        api.index_context(
            IndexRequest(
                corpus=CORPUS,
                source=SourceInput(id=source, revision=revision),
                chunks=(ChunkInput(id=chunk, text=text),),
            )
        )

    index("r1", "The dosage is 10 mg daily.")
    try:
        cited = api.get_passage(CORPUS, chunk, revision="r1")
        assert (cited.source.revision, cited.text) == ("r1", "The dosage is 10 mg daily.")
        index("r2", "The dosage is 500 mg daily.")
        with pytest.raises(SourceUnavailableError):
            api.get_passage(CORPUS, chunk, revision="r1")
        assert api.get_passage(CORPUS, chunk).text == "The dosage is 500 mg daily."
        assert api.get_passage(CORPUS, chunk, revision="r2").source.revision == "r2"
    finally:
        api.delete_context(corpus=CORPUS, source_id=source, revision="r2")


def _nested(depth: int) -> dict[str, JsonValue]:
    """A metadata object `depth` containers deep, itself counting 1."""
    value: JsonValue = 1
    for _ in range(depth - 1):
        value = [value]
    return {"x": value}


def test_metadata_as_deep_as_the_host_keeps_reads_back_and_deeper_is_refused(
    api: ClientApi, mode: str
) -> None:
    # A black-box test: metadata 197 deep was stored over HTTP, and every client listing and
    # search of the corpus that held it then failed to parse (ProtocolError); 300 deep,
    # stored in-process, made each such answer a 500.
    source_id = f"deep-{mode}"
    chunk = ChunkInput(id=f"{source_id}#0", text="The basalt quarry closes at dusk.")
    api.index_context(
        IndexRequest(
            corpus=CORPUS,
            source=SourceInput(id=source_id, revision="v1", metadata=_nested(MAX_METADATA_DEPTH)),
            chunks=(chunk,),
        )
    )
    hit = api.search_context(corpus=CORPUS, query="basalt quarry", source_ids=[source_id]).hits[0]
    assert hit.metadata == _nested(MAX_METADATA_DEPTH)
    assert any(s.id == source_id for s in api.list_sources(CORPUS))
    with pytest.raises(InvalidRequestError) as refused:
        api.index_context(
            IndexRequest(
                corpus=CORPUS,
                source=SourceInput(id=source_id, revision="v2", metadata=_nested(33)),
                chunks=(chunk,),
            )
        )
    assert f"at most {MAX_METADATA_DEPTH} levels" in str(refused.value)
    assert api.get_source(CORPUS, source_id).source.revision == "v1"
    api.delete_context(corpus=CORPUS, source_id=source_id, revision="v1")

"""Every retrieval method of `Client` and `AsyncClient` against a real host over TLS.

Each test runs twice (the `mode` fixture): once with the sync client, once with the async
client on a real event loop. Sources a test writes carry the mode in their id, because both
modes share the session's host.
"""

from __future__ import annotations

import io
import re
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from retrieval_host_client import (
    APIStatusError,
    AuthenticationError,
    ChunkInput,
    DeleteRequest,
    Hit,
    IndexRequest,
    InternalServerError,
    InvalidDocumentError,
    PayloadTooLargeError,
    PermissionDeniedError,
    SearchRequest,
    SourceConflictError,
    SourceInput,
    SourceUnavailableError,
    UnsupportedMediaTypeError,
)
from retrieval_host_client._base import UPLOAD_CHUNK_BYTES
from tests.client.conftest import HOST_LIMITS, Connect
from tests.client.modes import ClientApi
from tests.support.host import CORPUS, HANDBOOK, World

QUESTION = "How do I rotate a token?"
NOTE = """# Client note

The kettle descaling schedule is every second Tuesday.
Use citric acid, never vinegar, on the brass fittings.
"""


def _note(tag: str) -> str:
    return NOTE.replace("Client note", f"Client note {tag}")


def test_discover_needs_no_token(connect: Connect) -> None:
    info = connect(None).discover()
    assert info.name == "retrieval-host"
    assert info.version == "1"
    assert {"scoped-retrieval", "retrieval-indexing"} <= set(info.capabilities)
    assert info.auth.scheme == "bearer"
    assert info.limits.max_body_bytes == HOST_LIMITS["maxBodyBytes"]
    assert "text/markdown" in info.limits.ingest_media_types


@pytest.mark.parametrize("shape", ["model", "mapping", "camel-mapping", "keywords"])
def test_search_takes_a_model_a_mapping_or_keywords_and_returns_typed_hits(
    api: ClientApi, shape: str
) -> None:
    if shape == "model":
        response = api.search_context(SearchRequest(corpus=CORPUS, query=QUESTION, limit=2))
    elif shape == "mapping":
        response = api.search_context({"corpus": CORPUS, "query": QUESTION, "limit": 2})
    elif shape == "camel-mapping":
        response = api.search_context(
            {"corpus": CORPUS, "query": QUESTION, "limit": 2, "sourceIds": ["handbook"]}
        )
    else:
        response = api.search_context(corpus=CORPUS, query=QUESTION, limit=2)
    assert len(response.hits) == 2
    assert response.truncated is True
    best = response.hits[0]
    assert isinstance(best, Hit)
    assert best.chunk_id == "handbook-0"
    assert best.text == HANDBOOK[0]
    assert best.source.id == "handbook"
    assert best.source.revision == "r1"
    assert best.location.page == 1
    assert best.location.start_line == 1
    assert re.fullmatch(r"[0-9a-f]{64}", best.document_sha256)
    assert 0 < best.score <= 1
    assert best.scope.corpus == CORPUS
    assert response.usage.embedding.requests == 1


def test_search_refuses_unknown_fields_before_sending(api: ClientApi) -> None:
    with pytest.raises(ValidationError):
        api.search_context(corpus=CORPUS, query=QUESTION, top_k=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        api.search_context({"corpus": CORPUS, "query": QUESTION}, limit=2)


def test_a_document_of_another_type_is_a_type_error_before_sending(api: ClientApi) -> None:
    # A black-box test: an int reached the upload and raised AttributeError ('read').
    with pytest.raises(TypeError, match="path, bytes or a binary file object, not int"):
        api.ingest_context(5, corpus=CORPUS, source_id="n", media_type="text/markdown")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_metadata_that_json_cannot_hold_is_a_validation_error_before_sending(
    api: ClientApi, value: float
) -> None:
    # Probe "sdk", session 43: `json.dumps` raised a bare ValueError that named no field.
    with pytest.raises(ValidationError, match="metadata"):
        api.ingest_context(
            b"Chains want wax.",
            corpus=CORPUS,
            source_id="nan",
            media_type="text/plain",
            metadata={"weight": value},
        )


def test_index_then_unchanged_then_conflict(api: ClientApi, mode: str) -> None:
    source_id = f"{mode}-prepared"
    request = IndexRequest(
        corpus=CORPUS,
        source=SourceInput(id=source_id, revision="v1", title="Prepared"),
        chunks=(ChunkInput(id=f"{source_id}-0", text="Bicycle chains want wax, not oil."),),
    )
    first = api.index_context(request)
    assert first.status == "indexed"
    assert first.chunk_count == 1
    assert first.source.id == source_id
    assert first.usage.embedding.requests == 1

    again = api.index_context(request.model_dump())
    assert again.status == "unchanged"
    assert again.usage.embedding.requests == 0

    changed = request.model_copy(
        update={"chunks": (ChunkInput(id=f"{source_id}-0", text="Chains want oil."),)}
    )
    with pytest.raises(SourceConflictError) as caught:
        api.index_context(changed)
    error = caught.value
    assert error.status == 409
    assert error.code == "SOURCE_CONFLICT"
    assert error.request_id is not None and re.fullmatch(r"[0-9a-f]{32}", error.request_id)
    assert error.problem is not None and error.problem.code == "SOURCE_CONFLICT"

    hits = api.search_context(
        corpus=CORPUS, query="How do I care for a chain?", source_ids=[source_id]
    ).hits
    assert hits[0].chunk_id == f"{source_id}-0"
    assert hits[0].text == "Bicycle chains want wax, not oil."


def test_ingest_a_path_then_search_it_then_delete_it(
    api: ClientApi, mode: str, tmp_path: Path
) -> None:
    source_id = f"{mode}-note"
    path = tmp_path / "note.md"
    path.write_text(_note(mode), encoding="utf-8")
    indexed = api.ingest_context(path, corpus=CORPUS, source_id=source_id, revision="1")
    assert indexed.status == "indexed"
    assert indexed.source.revision == "1"
    assert indexed.chunk_count >= 1

    hits = api.search_context(
        corpus=CORPUS, query="How often is the kettle descaled?", source_ids=[source_id]
    ).hits
    assert hits and all(h.source.id == source_id for h in hits)
    assert "second Tuesday" in hits[0].text

    deleted = api.delete_context(DeleteRequest(corpus=CORPUS, source_id=source_id, revision="1"))
    assert deleted.deleted_chunks == indexed.chunk_count
    assert deleted.source.revision == "1"
    with pytest.raises(SourceUnavailableError) as caught:
        api.search_context(corpus=CORPUS, query="kettle", source_ids=[source_id])
    assert caught.value.code == "SOURCE_UNAVAILABLE"
    assert caught.value.status == 404
    with pytest.raises(SourceUnavailableError):
        api.delete_context(corpus=CORPUS, source_id=source_id, revision="1")


def test_ingest_bytes_and_file_objects_in_chunks(api: ClientApi, mode: str) -> None:
    text = _note(f"{mode} bytes").encode("utf-8")
    from_bytes = api.ingest_context(
        text, corpus=CORPUS, source_id=f"{mode}-bytes", media_type="text/markdown"
    )
    assert from_bytes.status == "indexed"
    # The revision defaults to a digest of the content: the same bytes are `unchanged`.
    again = api.ingest_context(
        text, corpus=CORPUS, source_id=f"{mode}-bytes", media_type="text/markdown"
    )
    assert again.status == "unchanged"
    assert again.source.revision == from_bytes.source.revision

    # A file object larger than one upload chunk is read piece by piece, never whole. (Blank
    # lines make it large without making passages: embedding them would only cost time.)
    body = (_note(f"{mode} file") + "\n" * 100_000 + "Rinse twice after descaling.\n").encode()
    assert 1.5 * UPLOAD_CHUNK_BYTES < len(body) < HOST_LIMITS["maxBodyBytes"]
    reads: list[int] = []

    class Recording(io.BytesIO):
        def read(self, size: int | None = -1, /) -> bytes:
            reads.append(-1 if size is None else size)
            return super().read(size)

    document = Recording(body)
    document.name = "appendix.md"  # the suffix gives the media type
    result = api.ingest_context(document, corpus=CORPUS, source_id=f"{mode}-file")
    assert result.status == "indexed"
    tail = api.search_context(
        corpus=CORPUS, query="rinse after descaling", source_ids=[f"{mode}-file"], limit=1
    ).hits[0]
    assert "Rinse twice" in tail.text
    assert tail.location.start_line is not None and tail.location.start_line > 100_000
    assert len(reads) >= 2
    assert all(0 < size <= UPLOAD_CHUNK_BYTES for size in reads)
    assert not document.closed  # the caller's file stays the caller's


def test_ingest_infers_the_media_type_or_refuses_before_sending(
    api: ClientApi, mode: str, tmp_path: Path
) -> None:
    page = tmp_path / "quay.html"
    page.write_text("<h1>Quay</h1>\n<p>The quay opens at dawn.</p>\n", encoding="utf-8")
    indexed = api.ingest_context(page, corpus=CORPUS, source_id=f"{mode}-quay-page")
    assert indexed.status == "indexed" and indexed.chunk_count == 1
    unknown = tmp_path / "note.docx"
    unknown.write_bytes(b"PK\x03\x04")
    with pytest.raises(ValueError, match="media_type"):
        api.ingest_context(unknown, corpus=CORPUS, source_id="x")
    with pytest.raises(ValueError, match="media_type"):
        api.ingest_context(b"# bytes have no name", corpus=CORPUS, source_id="x")


def test_ingest_errors_are_typed_by_code(api: ClientApi, mode: str, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedMediaTypeError) as unsupported:
        api.ingest_context(b"\x89PNG", corpus=CORPUS, source_id="x", media_type="image/png")
    assert unsupported.value.status == 415
    with pytest.raises(InvalidDocumentError) as invalid:
        api.ingest_context(b"not a pdf at all", corpus=CORPUS, source_id=f"{mode}-bad-pdf",
                           media_type="application/pdf")  # fmt: skip
    assert invalid.value.code == "INVALID_DOCUMENT"
    assert invalid.value.status == 422

    # Larger than the host's body limit: refused from its Content-Length, never all sent.
    big = tmp_path / "big.md"
    with big.open("w", encoding="utf-8") as out:
        out.write("# Big\n\n")
        for i in range(2 * int(HOST_LIMITS["maxBodyBytes"]) // 30):
            out.write(f"Padding line number {i:08d} here.\n")
    assert big.stat().st_size > 2 * HOST_LIMITS["maxBodyBytes"]
    with pytest.raises(PayloadTooLargeError) as too_large:
        api.ingest_context(big, corpus=CORPUS, source_id=f"{mode}-big")
    assert too_large.value.code == "PAYLOAD_TOO_LARGE"


def test_tokens_and_grants_map_to_typed_errors(connect: Connect, client_world: World) -> None:
    search = {"corpus": CORPUS, "query": QUESTION}
    with pytest.raises(AuthenticationError) as missing:
        connect(None).search_context(search)
    assert missing.value.status == 401
    assert missing.value.code == "UNAUTHENTICATED"
    with pytest.raises(PermissionDeniedError) as denied:
        connect("bob").search_context(search)
    assert denied.value.code == "PERMISSION_DENIED"
    # alice may read `handbook` only: `secret` is as unavailable as a source that never was.
    alice = connect("alice")
    with pytest.raises(SourceUnavailableError) as hidden:
        alice.search_context(corpus=CORPUS, query=QUESTION, source_ids=["secret"])
    with pytest.raises(SourceUnavailableError) as absent:
        alice.search_context(corpus=CORPUS, query=QUESTION, source_ids=["no-such-source"])
    assert hidden.value.problem is not None and absent.value.problem is not None
    assert hidden.value.problem.detail == absent.value.problem.detail
    assert {h.source.id for h in alice.search_context(search).hits} == {"handbook"}


def test_an_unexpected_host_error_is_internal_and_leaks_nothing(connect: Connect) -> None:
    with pytest.raises(InternalServerError) as caught:
        connect("boom").search_context(corpus=CORPUS, query=QUESTION)
    error = caught.value
    assert isinstance(error, APIStatusError)
    assert error.status == 500
    assert error.code == "INTERNAL"
    assert "hunter2" not in str(error)
    assert error.detail is not None and "hunter2" not in error.detail


def test_the_token_comes_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch, connect: Connect, client_world: World
) -> None:
    monkeypatch.setenv("RETRIEVAL_HOST_TOKEN", client_world.tokens["admin"])
    api = connect(None)
    # Read once, when the client was made: a later change does not reach it.
    monkeypatch.setenv("RETRIEVAL_HOST_TOKEN", "rh_not-a-known-token")
    assert api.search_context(corpus=CORPUS, query=QUESTION, limit=1).hits
    with pytest.raises(AuthenticationError):
        connect(None).search_context(corpus=CORPUS, query=QUESTION, limit=1)


def test_a_token_with_whitespace_is_refused_without_echoing_it(connect: Connect) -> None:
    with pytest.raises(ValueError, match="stripped") as caught:
        connect(None, token_value="rh_secret-value\n")
    assert "secret-value" not in str(caught.value)


def test_a_token_with_a_non_ascii_character_is_refused_saying_which_characters_may_appear(
    connect: Connect,
) -> None:
    with pytest.raises(ValueError, match="only ASCII letters") as caught:
        connect(None, token_value="rh_s\u00e9cret")
    assert "cret" not in str(caught.value)


def test_plain_http_is_refused_except_to_loopback(connect: Connect) -> None:
    with pytest.raises(ValueError, match="https"):
        connect(base_url="http://retrieval.example:8080")
    connect(base_url="http://127.0.0.1:9")  # a local TLS-terminating proxy is allowed


@pytest.mark.parametrize(
    ("base_url", "said"),
    [
        ("notaurl", "'notaurl'"),
        ("ftp://127.0.0.1:21", "'ftp://127.0.0.1:21'"),
        ("https://127.0.0.1:99999", "port must be 1-65535, got 99999"),
        # httpx's own InvalidURL is no ValueError: it escaped (probe O, session 40).
        ("https://[::1", "'https://[::1'"),
    ],
)
def test_a_url_that_cannot_be_reached_is_refused_quoting_what_was_given(
    connect: Connect, base_url: str, said: str
) -> None:
    with pytest.raises(ValueError, match="base_url") as caught:
        connect(base_url=base_url)
    assert said in str(caught.value)


def test_hits_carry_their_commit_time_and_max_age_narrows_the_search(api: ClientApi) -> None:
    recent = api.search_context(corpus=CORPUS, query=QUESTION, limit=2, max_age_s=10 * 365 * 86400)
    assert recent.hits and all(h.indexed_at for h in recent.hits)
    committed = datetime.fromisoformat(recent.hits[0].indexed_at or "")
    assert committed <= datetime.fromisoformat(recent.retrieved_at)
    # The sources were committed when the host's world was built, well over a millisecond ago.
    assert api.search_context(corpus=CORPUS, query=QUESTION, max_age_s=0.001).hits == []

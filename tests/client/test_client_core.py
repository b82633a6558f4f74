"""The shared core without I/O: error table, run-stream validation, and the two shells'
surfaces kept identical."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, get_args, get_origin

import httpx
import pytest

import retrieval_host_client
from retrieval_host_client import (
    AsyncClient,
    AuthenticationError,
    ChunkIdConflictError,
    Client,
    ConflictError,
    ContextReplayUnavailableError,
    DescriptorMismatchError,
    IndexRequest,
    NoRetrievalEvidenceError,
    Problem,
    ProtocolError,
    RunCompletedEvent,
    RunDeltaEvent,
    RunFailedEvent,
    RunProgressEvent,
    RunRequest,
    RunResult,
    RunRetrieval,
    SearchRequest,
    SourceConflictError,
    StoreReadOnlyError,
)
from retrieval_host_client._responses import RunEventReader, check_run_result, error_for
from retrieval_host_client.inspection_models import SourceListParams
from retrieval_host_client.models import _Request

ROOT = Path(__file__).resolve().parents[2]
HOST_CODES = [
    "UNAUTHENTICATED", "PERMISSION_DENIED", "SOURCE_UNAVAILABLE", "SOURCE_CONFLICT",
    "CHUNK_ID_CONFLICT", "DESCRIPTOR_MISMATCH", "CONTEXT_REPLAY_UNAVAILABLE", "INVALID_REQUEST",
    "INVALID_CITATION", "ANSWER_REJECTED", "INVALID_DOCUMENT", "DOCUMENT_TOO_COMPLEX",
    "UNSUPPORTED_MEDIA_TYPE", "PAYLOAD_TOO_LARGE",
    "CAPACITY_EXCEEDED", "NO_RETRIEVAL_EVIDENCE", "CANCELLED", "TIMEOUT", "HOST_BUSY",
    "UNSAFE_STORE", "STORE_READ_ONLY", "STORE_UNAVAILABLE", "EMBEDDING_FAILED",
    "PROVIDER_FAILED", "RERANK_FAILED", "INTERNAL",
]  # fmt: skip


def _problem_bytes(code: str, status: int, **extra: Any) -> bytes:
    doc = {"type": "urn:x", "title": "t", "status": status, "code": code, "detail": "d",
           "requestId": "r" * 32, **extra}  # fmt: skip
    return json.dumps(doc).encode()


def test_every_host_code_has_its_own_class() -> None:
    from retrieval_host.core.errors import STATUS, ErrorCode

    assert sorted(HOST_CODES) == sorted(c.value for c in ErrorCode)
    headers = httpx.Headers({"content-type": "application/problem+json"})
    for code in ErrorCode:
        error = error_for(STATUS[code], headers, _problem_bytes(code.value, STATUS[code]))
        assert error.code == code.value
        assert error.status == STATUS[code]
        assert error.request_id == "r" * 32
        assert type(error).__name__ != "APIStatusError", code


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("SOURCE_CONFLICT", SourceConflictError),
        ("CHUNK_ID_CONFLICT", ChunkIdConflictError),
        ("DESCRIPTOR_MISMATCH", DescriptorMismatchError),
        ("CONTEXT_REPLAY_UNAVAILABLE", ContextReplayUnavailableError),
        ("STORE_READ_ONLY", StoreReadOnlyError),
    ],
)
def test_conflicts_share_one_base(code: str, cls: type[ConflictError]) -> None:
    headers = httpx.Headers({"content-type": "application/problem+json"})
    error = error_for(409, headers, _problem_bytes(code, 409, reason="why"))
    assert type(error) is cls
    assert isinstance(error, ConflictError)
    assert error.reason == "why"


def test_a_problem_in_plain_json_is_still_a_problem_and_the_header_request_id_is_kept() -> None:
    error = error_for(
        401, httpx.Headers({"content-type": "application/json"}), _problem_bytes("X", 401)
    )
    assert type(error) is AuthenticationError
    assert error.code == "X"
    bare = error_for(401, httpx.Headers({"x-request-id": "abc"}), b"")
    assert type(bare) is AuthenticationError
    assert bare.request_id == "abc"
    assert bare.problem is None


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _result(**overrides: Any) -> dict[str, Any]:
    entry = {"id": "c1", "origin": "retrieval", "source": {"id": "s", "revision": "r"},
             "location": {"page": 2}}  # fmt: skip
    receipt = {"sequence": 1, "query": "q", "key": "k", "startedAt": "t", "status": "ok",
               "sourceIds": ["c1", "c2"]}  # fmt: skip
    result: dict[str, Any] = {
        "runId": "run_1", "status": "completed", "provider": "p", "model": "m",
        "text": "Answer [source:c1].", "sources": [entry], "receipts": [receipt],
        "usage": {"generation": {"requests": 1}, "embedding": {"requests": 1}},
        "createdAt": "t", "completedAt": "t",
        "artifact": {"name": "a.md", "mediaType": "text/markdown", "sourceIds": ["c1"]},
    }  # fmt: skip
    result.update(overrides)
    return result


STARTED = {"type": "run.started", "runId": "run_1", "createdAt": "t"}


def test_the_reader_yields_typed_events_in_order_and_the_outcome() -> None:
    reader = RunEventReader()
    body = _sse(
        STARTED,
        {"type": "run.progress", "phase": "retrieval.scan", "corpus": "library", "rows": 2},
        {"type": "run.delta", "text": "Answer "},
        {"type": "run.completed", "result": _result()},
    )
    events = [e for i in range(len(body)) for e in reader.feed(body[i : i + 1])]
    assert [type(e) for e in events][1:] == [RunProgressEvent, RunDeltaEvent, RunCompletedEvent]
    progress = events[1]
    assert isinstance(progress, RunProgressEvent)
    assert progress.context == {"corpus": "library", "rows": 2}
    assert reader.finished
    reader.end()
    assert reader.outcome().sources[0].location.page == 2


def test_a_failed_run_is_an_event_and_its_outcome_raises_the_typed_error() -> None:
    reader = RunEventReader()
    problem = json.loads(_problem_bytes("NO_RETRIEVAL_EVIDENCE", 422))
    events = reader.feed(_sse(STARTED, {"type": "run.failed", "runId": "run_1",
                                        "problem": problem}))  # fmt: skip
    assert isinstance(events[-1], RunFailedEvent)
    assert isinstance(events[-1].problem, Problem)
    with pytest.raises(NoRetrievalEvidenceError) as caught:
        reader.outcome()
    assert caught.value.status == 422


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([STARTED, {"type": "run.progress"}], "without its phase"),
        ([STARTED, {"type": "run.progress", "phase": ""}], "without its phase"),
        ([STARTED, STARTED], "second run.started"),
        ([STARTED, {"type": "run.completed", "result": _result(runId="run_2")}], "another run"),
        ([STARTED, {"type": "run.delta", "text": 3}], "malformed run.delta"),
    ],
)
def test_the_reader_refuses_what_breaks_the_protocol(
    events: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message):
        RunEventReader().feed(_sse(*events))


def test_a_mismatched_event_name_and_type_is_refused() -> None:
    body = b'event: run.delta\ndata: {"type": "run.progress", "phase": "x"}\n\n'
    reader = RunEventReader()
    reader.feed(_sse(STARTED))
    with pytest.raises(ProtocolError, match=r"malformed run\.delta"):
        reader.feed(body)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"receipts": []}, "references no returned hit"),
        ({"artifact": {"name": "a", "mediaType": "t", "sourceIds": ["c2"]}}, "not in the manifest"),
    ],
)
def test_manifests_reference_only_returned_hits(overrides: dict[str, Any], message: str) -> None:
    check_run_result(RunResult.model_validate(_result()))
    with pytest.raises(ProtocolError, match=message):
        check_run_result(RunResult.model_validate(_result(**overrides)))


def test_responses_tolerate_new_fields_and_requests_forbid_them() -> None:
    result = RunResult.model_validate(_result(futureField={"x": 1}))
    assert result.model_extra == {"futureField": {"x": 1}}
    with pytest.raises(ValueError, match="extra"):
        retrieval_host_client.SearchRequest.model_validate({"corpus": "c", "query": "q", "k": 1})


def _holds_a_list(annotation: object) -> bool:
    return get_origin(annotation) is list or any(map(_holds_a_list, get_args(annotation)))


def test_request_models_type_their_sequences_as_tuples() -> None:
    # As the README says (`source_ids=("a", "b")`): a type checker without pydantic's plugin
    # refused a tuple for a list-typed field, and a list made a frozen request unhashable.
    requests: list[type[_Request]] = []
    pending = [_Request]
    while pending:
        subclasses = pending.pop().__subclasses__()
        requests += subclasses
        pending += subclasses
    assert {RunRetrieval, SearchRequest, IndexRequest, SourceListParams} <= set(requests)
    listed = [
        f"{model.__name__}.{name}"
        for model in requests
        for name, field in model.model_fields.items()
        if _holds_a_list(field.annotation)
    ]
    assert listed == []
    retrieval = RunRetrieval(corpus="library", source_ids=["a", "b"])  # lists still accepted
    assert retrieval.source_ids == ("a", "b")
    assert hash(retrieval) == hash(RunRetrieval(corpus="library", source_ids=("a", "b")))
    # The wire format is unchanged: a JSON array, as SearchRequest's.
    body = RunRequest(provider="local", model="m", input="q", retrieval=retrieval)
    assert json.loads(body.model_dump_json(by_alias=True, exclude_unset=True))["retrieval"] == {
        "corpus": "library",
        "sourceIds": ["a", "b"],
    }


def test_the_two_shells_have_the_same_methods_and_signatures() -> None:
    def surface(cls: type[object]) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, asynchronous = surface(Client), surface(AsyncClient)
    assert sync.pop("close") == asynchronous.pop("aclose")
    assert sync.keys() == asynchronous.keys()
    for name, signature in sync.items():
        other = asynchronous[name]
        assert list(signature.parameters.values()) == list(other.parameters.values()), name
    for name in sync:
        method = getattr(AsyncClient, name)
        wrapped = getattr(method, "__wrapped__", method)
        assert inspect.iscoroutinefunction(wrapped) or inspect.isasyncgenfunction(wrapped), name
        assert getattr(Client, name).__doc__, name
        assert method.__doc__, name
    assert set(sync) == {
        "discover", "search_context", "index_context", "ingest_context", "delete_context",
        "run", "stream_run", "get_run", "list_corpora", "list_write_only_corpora",
        "list_sources", "get_source",
        "get_passage",
    }  # fmt: skip


def test_the_public_surface_is_exported_and_documented() -> None:
    for name in retrieval_host_client.__all__:
        member = getattr(retrieval_host_client, name)
        mine = getattr(member, "__module__", "").startswith("retrieval_host_client._")
        if mine and (isinstance(member, type) or inspect.isfunction(member)):
            assert getattr(member, "__doc__", None), name
    assert "validate_source_citations" in retrieval_host_client.__all__
    assert (ROOT / "sdk_client" / "retrieval_host_client" / "py.typed").exists()


def test_the_client_package_imports_nothing_of_the_host() -> None:
    package = ROOT / "sdk_client" / "retrieval_host_client"
    for path in package.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "retrieval_host." not in source and "import retrieval_host\n" not in source, path

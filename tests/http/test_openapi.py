"""The OpenAPI document: generated from the wire models, every route, problems and security."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from retrieval_host.core.errors import ErrorCode
from retrieval_host.core.reasons import REASONS, reasons_of
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.routes import ingest_media_types
from retrieval_host_client import models as wire

RETRIEVAL = [
    "/v1/retrieval/search",
    "/v1/retrieval/index",
    "/v1/retrieval/ingest",
    "/v1/retrieval/delete",
]
PUBLIC = ["/v1/protocol", "/v1/openapi.json", "/healthz", "/readyz"]
INSPECTION = [
    "/v1/corpora",
    "/v1/corpora/{corpus}/sources",
    "/v1/corpora/{corpus}/sources/{sourceId}",
    "/v1/corpora/{corpus}/passages/{chunkId}",
]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_openapi(version="1.2.3", ingest_media_types=ingest_media_types())


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema["$ref"]
    assert ref.startswith("#/components/schemas/")
    resolved: dict[str, Any] = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return resolved


def test_every_route_is_documented_with_its_security(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == "1.2.3"
    assert set(document["paths"]) == set(PUBLIC + RETRIEVAL + INSPECTION + ["/metrics"])
    for path in PUBLIC:
        assert document["paths"][path]["get"]["security"] == []
    for path in RETRIEVAL:
        operation = document["paths"][path]["post"]
        assert operation["security"] == [{"bearerAuth": []}]
        assert operation["responses"]["401"]["headers"]["WWW-Authenticate"]
    for path in INSPECTION:
        operation = document["paths"][path]["get"]
        assert operation["security"] == [{"bearerAuth": []}]
        assert set(operation["responses"]) >= {"200", "401", "403"}
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert scheme == {**scheme, "type": "http", "scheme": "bearer"}


def test_every_problem_response_uses_the_problem_schema(document: dict[str, Any]) -> None:
    for path, methods in document["paths"].items():
        for operation in methods.values():
            responses = operation["responses"]
            assert "200" in responses
            assert "500" in responses, path
            for status, response in responses.items():
                assert "X-Request-Id" in response["headers"]
                if status == "200" or (path == "/readyz" and status == "503"):
                    continue
                content = response["content"]["application/problem+json"]["schema"]
                problem = _resolve(document, content)
                assert set(problem["required"]) >= {
                    "type",
                    "title",
                    "status",
                    "code",
                    "detail",
                    "requestId",
                }


def test_the_answers_that_can_say_when_to_retry_declare_retry_after() -> None:
    # A 503 HOST_BUSY says Retry-After: 1; a model's 502 passes on the model's own wait.
    document = build_openapi(version="1", ingest_media_types=ingest_media_types(), runs=True)
    responses = document["paths"]["/v1/runs"]["post"]["responses"]
    for status in ("502", "503"):
        header = responses[status]["headers"]["Retry-After"]
        assert header["schema"] == {"type": "integer", "minimum": 0, "maximum": 86400}
    assert "Retry-After" not in responses["422"]["headers"]


def _problem_schema(document: dict[str, Any]) -> dict[str, Any]:
    schema = document["paths"]["/v1/retrieval/search"]["post"]["responses"]["422"]["content"]
    return _resolve(document, schema["application/problem+json"]["schema"])


def test_the_problem_schema_publishes_every_code_and_its_reasons(
    document: dict[str, Any],
) -> None:
    problem = _problem_schema(document)
    assert problem["properties"]["code"]["enum"] == [code.value for code in ErrorCode]
    by_code = problem["x-reasons-by-code"]
    assert by_code == {code.value: list(reasons_of(code)) for code in ErrorCode}
    assert {code for code, reasons in by_code.items() if reasons} == {c.value for c in REASONS}
    listed = problem["properties"]["reason"]["anyOf"][0]["enum"]
    assert set(listed) == {reason for enum in REASONS.values() for reason in enum}
    # The conditionals hold each code to its own reasons, as a validator reads them.
    validator = jsonschema.Draft202012Validator(problem)
    body = {"type": "t", "title": "x", "status": 503, "detail": "d", "requestId": "r"}
    assert validator.is_valid({**body, "code": "HOST_BUSY", "reason": "busy"})
    assert validator.is_valid({**body, "code": "STORE_UNAVAILABLE", "reason": "closed"})
    assert validator.is_valid({**body, "code": "STORE_UNAVAILABLE"})  # a reason is optional
    assert not validator.is_valid({**body, "code": "HOST_BUSY", "reason": "closed"})
    assert not validator.is_valid({**body, "code": "HOST_BUSY", "reason": "not-a-reason"})
    assert not validator.is_valid({**body, "code": "INTERNAL", "reason": "busy"})
    assert not validator.is_valid({**body, "code": "NOT_A_CODE"})


def test_request_schemas_are_the_validating_models(document: dict[str, Any]) -> None:
    cases: list[tuple[str, type[BaseModel]]] = [
        ("/v1/retrieval/search", wire.SearchRequest),
        ("/v1/retrieval/index", wire.IndexRequest),
        ("/v1/retrieval/delete", wire.DeleteRequest),
    ]
    for path, model in cases:
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        schema = _resolve(document, body["schema"])
        assert schema["additionalProperties"] is False  # unknown fields are refused
        expected = model.model_json_schema(by_alias=True, mode="validation")
        assert set(schema["properties"]) == set(expected["properties"])
    search = _resolve(
        document,
        document["paths"]["/v1/retrieval/search"]["post"]["requestBody"]["content"][
            "application/json"
        ]["schema"],
    )
    assert search["properties"]["limit"] == {
        **search["properties"]["limit"],
        "type": "integer",
        "minimum": 1,
        "maximum": 100,
    }
    assert search["required"] == ["corpus", "query"]


def test_ingest_takes_raw_documents_and_query_parameters(document: dict[str, Any]) -> None:
    ingest = document["paths"]["/v1/retrieval/ingest"]["post"]
    assert set(ingest["requestBody"]["content"]) == {
        "application/pdf",
        "text/markdown",
        "message/rfc822",
        "application/mbox",
        "text/plain",
        "text/html",
    }
    parameters = {p["name"]: p for p in ingest["parameters"]}
    assert set(parameters) == {
        "corpus",
        "sourceId",
        "revision",
        "title",
        "metadata",
        "idleTimeoutMs",
    }
    idle = parameters["idleTimeoutMs"]["schema"]
    assert (idle["type"], idle["minimum"]) == ("integer", 1) and "anyOf" not in idle
    assert parameters["corpus"]["required"] and parameters["sourceId"]["required"]
    assert not parameters["revision"]["required"]
    assert all(p["in"] == "query" for p in parameters.values())
    assert "anyOf" not in parameters["revision"]["schema"]  # absent, never null
    # A JSON object in one parameter: described by its media type and schema.
    metadata = parameters["metadata"]["content"]["application/json"]["schema"]
    assert metadata["type"] == "object" and metadata["maxProperties"] == 16
    assert "schema" not in parameters["metadata"]


def test_response_models_tolerate_new_fields_and_request_models_refuse_them() -> None:
    hit = wire.Problem.model_validate(
        {
            "type": "t",
            "title": "x",
            "status": 1,
            "code": "C",
            "detail": "d",
            "requestId": "r",
            "new": 1,
        }
    )
    assert hit.model_extra == {"new": 1}
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        wire.DeleteRequest.model_validate({"corpus": "c", "sourceId": "s", "revision": "r", "x": 1})
    built = wire.SearchRequest(corpus="c", query="q", source_ids=("a",))  # by name in Python
    assert built.model_dump(by_alias=True, exclude_none=True) == {
        "corpus": "c",
        "query": "q",
        "sourceIds": ("a",),
        "limit": 8,
        "mode": "hybrid",
    }


def test_inspection_routes_document_their_path_and_page_parameters(
    document: dict[str, Any],
) -> None:
    def parameters(path: str) -> dict[tuple[str, str], dict[str, Any]]:
        found = document["paths"][path]["get"].get("parameters", [])
        return {(p["in"], p["name"]): p for p in found}

    assert parameters("/v1/corpora") == {}
    listing = parameters("/v1/corpora/{corpus}/sources")
    assert set(listing) == {
        ("path", "corpus"),
        ("query", "limit"),
        ("query", "cursor"),
        ("query", "title"),
        ("query", "mediaType"),
    }
    assert listing[("query", "limit")]["schema"]["maximum"] == 1000
    assert not listing[("query", "cursor")]["required"]
    assert set(parameters("/v1/corpora/{corpus}/sources/{sourceId}")) == {
        ("path", "corpus"),
        ("path", "sourceId"),
        ("query", "limit"),
        ("query", "cursor"),
    }
    passage = parameters("/v1/corpora/{corpus}/passages/{chunkId}")
    assert set(passage) == {("path", "corpus"), ("path", "chunkId"), ("query", "revision")}
    # A corpus id holding `/` is one escaped segment the host serves (probe B: the pattern
    # refused it).
    corpus_pattern = re.compile(listing[("path", "corpus")]["schema"]["pattern"])
    assert corpus_pattern.match("team/a") and corpus_pattern.match("library")
    assert not corpus_pattern.match("/team") and not corpus_pattern.match("a" * 129)
    assert not passage[("query", "revision")]["required"]
    success = document["paths"]["/v1/corpora/{corpus}/passages/{chunkId}"]["get"]["responses"]
    schema = _resolve(document, success["200"]["content"]["application/json"]["schema"])
    assert set(schema["properties"]) >= {"chunkId", "text", "location", "source", "scope"}

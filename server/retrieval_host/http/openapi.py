"""OpenAPI 3.1 of protocol v1, generated from the wire models that validate the requests.

Request bodies use the models' validation schemas and responses their serialization schemas,
both from `retrieval_host_client.models`, so the document cannot drift from what the host
accepts and returns. Every operation lists its problem responses and its security. The problem
schema publishes every code and, per code, every `reason` (`core.reasons`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from retrieval_host.core.errors import ErrorCode
from retrieval_host.core.reasons import reasons_of
from retrieval_host.http.routes import EMPTY_MEANS_NOT_GIVEN
from retrieval_host_client import models as wire
from retrieval_host_client import run_models as run_wire

REF: Final = "#/components/schemas/{model}"
PROBLEM_MEDIA_TYPE: Final = "application/problem+json"

_STATUS_TEXT: Final = {
    400: "The body is not valid JSON, or the request is ambiguous: a repeated JSON key at any "
    "depth, a repeated query parameter, query parameters that are not UTF-8, two Authorization "
    "headers, a listing's `limit` outside 1..1000 or a cursor it did not return, a query "
    "string on a route that reads a JSON body "
    "(`INVALID_REQUEST`; reason `duplicate-key`, `duplicate-parameter`, `invalid-utf8`, "
    "`duplicate-authorization`, `page-limit`, `invalid-cursor`, `query-on-json-route`), a JSON "
    "body nested too deeply "
    "(`json-depth`), two Content-Type headers (`duplicate-header`), a Host header this host "
    "does not answer to (`host-not-allowed`), or a "
    "request that is not valid HTTP/1.1 (`bad-http`).",
    401: "No valid bearer token, or a token in the query string (`UNAUTHENTICATED`).",
    403: "The token has no grant for this corpus, the corpus does not exist, or the Origin is "
    "not allowed (`PERMISSION_DENIED`).",
    404: "A named source is unavailable: missing or not authorized, indistinguishably "
    "(`SOURCE_UNAVAILABLE`).",
    408: "A time limit on the caller's side: the request headers or body did not arrive in "
    "time, or a run made no progress within the `idleTimeoutMs` it set (`TIMEOUT`; reason "
    "`request-timeout` or `idle-timeout`).",
    409: "A conflicting revision, chunk id or corpus descriptor (`SOURCE_CONFLICT`, "
    "`CHUNK_ID_CONFLICT`, `DESCRIPTOR_MISMATCH`), or a write to a read-only store "
    "(`STORE_READ_ONLY`).",
    413: "The body or a corpus capacity is too large (`PAYLOAD_TOO_LARGE`, `CAPACITY_EXCEEDED`).",
    415: "Unsupported Content-Type or Content-Encoding (`UNSUPPORTED_MEDIA_TYPE`).",
    431: "The request line and headers are larger than 64 KiB (`INVALID_REQUEST`, reason "
    "`headers-too-large`).",
    422: (
        "The request or document is invalid (`INVALID_REQUEST`, `INVALID_DOCUMENT`), the "
        "document costs more work than allowed (`DOCUMENT_TOO_COMPLEX`), or a run's answer "
        "failed a check (`INVALID_CITATION`, `ANSWER_REJECTED`)."
    ),
    500: "The host failed (`INTERNAL`, `UNSAFE_STORE`); nothing of the cause is disclosed.",
    502: "The embedding service failed (`EMBEDDING_FAILED`).",
    503: "The host is at its concurrency limit or a store is unavailable (`HOST_BUSY`, "
    "`STORE_UNAVAILABLE`).",
}
_PUBLIC_PROBLEMS: Final = (403, 408, 413, 500)
# What any request may get before it reaches a route: the server protocol's answers (malformed
# HTTP, headers too large or too slow), the Host check, the request rules (a token in the query
# string, a content coding, two Content-Types: `hygiene`), the body limit.
_ANY_REQUEST: Final = (400, 401, 408, 413, 415, 431)
_RETRIEVAL_PROBLEMS: Final = (400, 401, 403, 404, 408, 409, 413, 415, 422, 500, 502, 503)


@dataclass(frozen=True, slots=True)
class _Operation:
    path: str
    method: Literal["get", "post"]
    operation_id: str
    summary: str
    response: type[BaseModel] | None  # None: a free-form JSON object
    request: type[BaseModel] | None = None
    secured: bool = False
    problems: Sequence[int] = _PUBLIC_PROBLEMS
    ingest: bool = False
    stream: str | None = None  # what the event stream of `Accept: text/event-stream` sends
    query: type[BaseModel] | None = None  # the model of its query parameters
    path_params: Sequence[tuple[str, dict[str, Any]]] = ()  # (name, schema)
    # Served with or without a retrieval service (`GET /metrics` sits before the routes).
    always: bool = False
    # The 200 body's media type when it is not JSON, and per-status texts of this operation.
    text_response: str | None = None
    problem_texts: Mapping[int, str] = field(default_factory=dict)


def _run_operations() -> list[_Operation]:
    return [
        _Operation(
            "/v1/runs",
            "post",
            "createRun",
            "A grounded run (token provider grant, plus `search` for retrieval): one JSON "
            "result, or Server-Sent Events with `Accept: text/event-stream`.",
            run_wire.RunResult,
            run_wire.RunRequest,
            secured=True,
            problems=_RETRIEVAL_PROBLEMS,
            stream=(
                "run.started, run.progress ({phase, ...context}), run.delta, then run.completed "
                "or run.failed (a problem body)"
            ),
        ),
        _Operation(
            "/v1/runs/{runId}",
            "get",
            "getRun",
            "The recorded run of the token's subject, its evidence re-authorized.",
            run_wire.RunRecord,
            secured=True,
            problems=(400, 401, 403, 404, 408, 422, 500, 503),
        ),
    ]


def _operations() -> list[_Operation]:
    return [
        _Operation(
            "/v1/protocol",
            "get",
            "getProtocol",
            "Protocol name and version, capabilities, limits and auth scheme (no token).",
            wire.ProtocolInfo,
        ),
        _Operation("/v1/openapi.json", "get", "getOpenApi", "This document (no token).", None),
        _Operation("/healthz", "get", "getHealth", "Liveness.", wire.Health),
        _Operation(
            "/readyz",
            "get",
            "getReadiness",
            "Readiness: stores open and answering, models loaded, and with `listen.workers` every "
            "worker accepting on its listeners (503 when not).",
            wire.Readiness,
        ),
        _Operation(
            "/v1/retrieval/search",
            "post",
            "search",
            "Search what the token's subject may read (token `search` grant).",
            wire.SearchResponse,
            wire.SearchRequest,
            secured=True,
            problems=_RETRIEVAL_PROBLEMS,
        ),
        _Operation(
            "/v1/retrieval/index",
            "post",
            "index",
            "Index one complete source revision from prepared passages (token `index` grant).",
            wire.IndexResponse,
            wire.IndexRequest,
            secured=True,
            problems=_RETRIEVAL_PROBLEMS,
        ),
        _Operation(
            "/v1/retrieval/ingest",
            "post",
            "ingest",
            "Index a raw document sent as the body, with its Content-Type: PDF, Markdown, "
            "plain text, HTML, an e-mail message or an mbox thread (token `index` grant).",
            wire.IndexResponse,
            wire.IngestParams,
            secured=True,
            problems=_RETRIEVAL_PROBLEMS,
            ingest=True,
            stream=(
                "ingest.started, ingest.progress ({phase: parse, embed or commit, passagesDone, "
                "passagesTotal}), then ingest.completed ({result}) or ingest.failed ({problem})"
            ),
        ),
        _Operation(
            "/metrics",
            "get",
            "getMetrics",
            "Prometheus metrics in the text exposition format (a token with `metrics: true`).",
            None,
            secured=True,
            problems=(401, 403, 500),
            always=True,
            text_response="text/plain",
            problem_texts={
                403: "The token lacks the metrics grant (`metrics: true` in its entry) "
                "(`PERMISSION_DENIED`)."
            },
        ),
        _Operation(
            "/v1/retrieval/delete",
            "post",
            "delete",
            "Delete exactly one source revision (token `delete` grant).",
            wire.DeleteResponse,
            wire.DeleteRequest,
            secured=True,
            problems=_RETRIEVAL_PROBLEMS,
        ),
    ]


# Path segments. A corpus id is one segment, a `/` in it escaped (`team%2Fa`:
# `http.corpus_paths`); source and chunk ids take the rest of the path, `/` and all.
_CORPUS_SEGMENT: Final = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"}
_ID_SEGMENT: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": 256,
    "pattern": wire.IDENTIFIER_PATTERN,
}
_INSPECTION_PROBLEMS: Final = (400, 401, 403, 404, 408, 409, 422, 500, 503)


def _inspection_operations() -> list[_Operation]:
    corpus = ("corpus", _CORPUS_SEGMENT)
    return [
        _Operation(
            "/v1/corpora",
            "get",
            "listCorpora",
            "The corpora the token may search, with its operations on each and counts over "
            "the sources its subject may search.",
            wire.CorporaResponse,
            secured=True,
            problems=(401, 403, 408, 422, 500, 503),
        ),
        _Operation(
            "/v1/corpora/{corpus}/sources",
            "get",
            "listSources",
            "One page of the sources the token's subject may search, at their authorized "
            "revision, by id (token `search` grant); follow `nextCursor`. With `title` or "
            "`mediaType`, a page may hold fewer than `limit` sources and still a cursor.",
            wire.SourcesResponse,
            secured=True,
            problems=_INSPECTION_PROBLEMS,
            query=wire.SourceListParams,
            path_params=(corpus,),
        ),
        _Operation(
            "/v1/corpora/{corpus}/sources/{sourceId}",
            "get",
            "getSource",
            "One source at its authorized revision with a page of its passages; a missing "
            "and an unauthorized source are the same 404.",
            wire.SourceResponse,
            secured=True,
            problems=_INSPECTION_PROBLEMS,
            query=wire.PageParams,
            path_params=(corpus, ("sourceId", _ID_SEGMENT)),
        ),
        _Operation(
            "/v1/corpora/{corpus}/passages/{chunkId}",
            "get",
            "getPassage",
            "One passage as a search hit shows it, authorized at read: navigate a saved "
            "citation (a changed revision or a revoked grant is the 404 of a missing one; "
            "`revision`, the citation's, also refuses a new revision that reuses the chunk id).",
            wire.PassageResponse,
            secured=True,
            problems=(400, 401, 403, 404, 408, 422, 500, 503),
            query=wire.PassageParams,
            path_params=(corpus, ("chunkId", _ID_SEGMENT)),
        ),
    ]


def _schemas() -> tuple[dict[tuple[type[BaseModel], JsonSchemaMode], Any], dict[str, Any]]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (wire.SearchRequest, "validation"),
        (wire.IndexRequest, "validation"),
        (wire.DeleteRequest, "validation"),
        (wire.SearchResponse, "serialization"),
        (wire.IndexResponse, "serialization"),
        (wire.DeleteResponse, "serialization"),
        (wire.ProtocolInfo, "serialization"),
        (wire.Health, "serialization"),
        (wire.Readiness, "serialization"),
        (wire.Problem, "serialization"),
        (wire.CorporaResponse, "serialization"),
        (wire.SourcesResponse, "serialization"),
        (wire.SourceResponse, "serialization"),
        (wire.PassageResponse, "serialization"),
        (run_wire.RunRequest, "validation"),
        (run_wire.RunResult, "serialization"),
        (run_wire.RunRecord, "serialization"),
    ]
    refs, top = models_json_schema(models, by_alias=True, ref_template=REF)
    return {key: refs[key] for key in models}, dict(top.get("$defs", {}))


def _with_reasons(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem schema with its codes and reasons enumerated.

    `code` lists every `ErrorCode`; `reason` every reason of any code, and one `if`/`then` per
    code narrows it to that code's reasons (or none: absent or null). The conditionals are
    JSON Schema 2020-12, which OpenAPI 3.1 uses, so a validator (schemathesis included) holds
    each response to them; `x-reasons-by-code` states the same map plainly for readers and
    generators that skip conditionals.
    """
    by_code = {code.value: list(reasons_of(code)) for code in ErrorCode}
    properties = dict(problem["properties"])
    properties["code"] = {**properties["code"], "enum": list(by_code)}
    every_reason = sorted({reason for reasons in by_code.values() for reason in reasons})
    properties["reason"] = {
        **properties["reason"],
        "anyOf": [{"type": "string", "enum": every_reason}, {"type": "null"}],
    }
    narrowing = [
        {
            "if": {"properties": {"code": {"const": code}}, "required": ["code"]},
            "then": {
                "properties": {
                    "reason": {"anyOf": [{"enum": reasons}, {"type": "null"}]}
                    if reasons
                    else {"type": "null"}
                }
            },
        }
        for code, reasons in by_code.items()
    ]
    return {**problem, "properties": properties, "allOf": narrowing, "x-reasons-by-code": by_code}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    # An optional query parameter is absent, never null: keep only the non-null branch.
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(options) == 1:
        kept = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        return {**kept, **options[0]}
    return schema


# Query parameters that hold a JSON document (percent-encoded), described by its schema.
_JSON_PARAMETERS: Final = frozenset({"metadata"})


def _query_parameter(name: str, required: bool, schema: dict[str, Any]) -> dict[str, Any]:
    parameter: dict[str, Any] = {"name": name, "in": "query", "required": required}
    if name in EMPTY_MEANS_NOT_GIVEN:
        # Sent empty, the parameter is as if absent (`routes.EMPTY_MEANS_NOT_GIVEN`).
        parameter["allowEmptyValue"] = True
    if name in _JSON_PARAMETERS:
        parameter["content"] = {"application/json": {"schema": schema}}
    else:
        parameter["schema"] = schema
    return parameter


# On a 503 `HOST_BUSY` (1 s) and on a 502 whose model or embedding service said how long to wait
# (`problems.retry_after`); the problem body's `retryAfter` says the same.
_RETRY_AFTER: dict[str, Any] = {
    "description": (
        "Seconds to wait before trying again, when known: 1 on `HOST_BUSY`; on a 502, the "
        "upstream service's own `Retry-After` (at most 86400), as the problem's `retryAfter`."
    ),
    "schema": {"type": "integer", "minimum": 0, "maximum": 86400},
}


def build_openapi(
    *,
    version: str,
    ingest_media_types: Sequence[str],
    retrieval: bool = True,
    runs: bool = False,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route this host serves (retrieval routes only when a
    retrieval service is configured)."""
    refs, components = _schemas()
    problem_name = refs[(wire.Problem, "serialization")]["$ref"].rsplit("/", 1)[1]
    components[problem_name] = _with_reasons(components[problem_name])
    request_id_header = {"$ref": "#/components/headers/RequestId"}

    def problem(status: int, text: str | None = None) -> dict[str, Any]:
        headers: dict[str, Any] = {"X-Request-Id": request_id_header}
        if status == 401:
            headers["WWW-Authenticate"] = {
                "description": "The Bearer challenge.",
                "schema": {"type": "string"},
            }
        elif status in (502, 503):
            headers["Retry-After"] = _RETRY_AFTER
        return {
            "description": text or _STATUS_TEXT[status],
            "headers": headers,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": refs[(wire.Problem, "serialization")]}},
        }

    paths: dict[str, Any] = {}
    every = [*_operations(), *_inspection_operations(), *(_run_operations() if runs else [])]
    for op in every:
        if op.secured and not retrieval and not op.always:
            continue
        success_schema: dict[str, Any]
        if op.text_response is not None:
            success_schema = {"type": "string"}
        elif op.response is None:
            success_schema = {"type": "object"}
        else:
            success_schema = refs[(op.response, "serialization")]
        responses: dict[str, Any] = {
            "200": {
                "description": "Success.",
                "headers": {"X-Request-Id": request_id_header},
                "content": {op.text_response or "application/json": {"schema": success_schema}},
            }
        }
        for status in sorted({*op.problems, *_ANY_REQUEST}):
            responses[str(status)] = problem(status, op.problem_texts.get(status))
        if op.path == "/readyz":
            responses["503"] = {
                "description": "Not ready.",
                "headers": {"X-Request-Id": request_id_header},
                "content": {"application/json": {"schema": success_schema}},
            }
        operation: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "security": [{"bearerAuth": []}] if op.secured else [],
            "responses": responses,
        }
        if op.ingest:
            assert op.request is not None
            params = op.request.model_json_schema(by_alias=True, mode="validation")
            required = set(params.get("required", []))
            operation["parameters"] = [
                _query_parameter(name, name in required, _without_null(schema))
                for name, schema in params["properties"].items()
            ]
            operation["requestBody"] = {
                "required": True,
                "description": "The raw document.",
                "content": {
                    media: {"schema": {"type": "string", "contentMediaType": media}}
                    for media in ingest_media_types
                },
            }
        elif op.request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(op.request, "validation")]}},
            }
        if op.stream is not None:
            # A Media Type Object has no `description` (OpenAPI 3.1): the response says it.
            responses["200"]["content"]["text/event-stream"] = {"schema": {"type": "string"}}
            responses["200"]["description"] = (
                "Success: the JSON result, or with `Accept: text/event-stream` Server-Sent "
                f"Events {op.stream}; heartbeat comments between them."
            )
        if op.query is not None or op.path_params:
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": schema}
                for name, schema in op.path_params
            ]
        if op.query is not None:
            params = op.query.model_json_schema(by_alias=True, mode="validation")
            operation["parameters"] += [
                {"name": name, "in": "query", "required": False, "schema": _without_null(schema)}
                for name, schema in params["properties"].items()
            ]
        if "{runId}" in op.path:
            operation["parameters"] = [
                {"name": "runId", "in": "path", "required": True, "schema": {"type": "string"}}
            ]
        paths.setdefault(op.path, {})[op.method] = operation

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "retrieval-host",
            "version": version,
            "description": "Authenticated retrieval over HTTPS: ingest, index, authorized search "
            "and delete. Errors are application/problem+json with a stable `code`. A path no "
            "route serves answers 404 and a method its path does not serve 405 with `Allow` "
            "(`INVALID_REQUEST`, reason `route`), on every path.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from `retrieval-host token new`; the host stores "
                    "only its SHA-256. Tokens in query strings are refused.",
                }
            },
            "headers": {
                "RequestId": {
                    "description": "The id of this request, also in every problem body.",
                    "required": True,
                    "schema": {"type": "string"},
                }
            },
        },
    }

"""One rule per case, the same in the wire schema and in the host (issue 13, defect 5).

Each test pins a case where the OpenAPI schema and the host used to disagree, or where an
ambiguous request was silently read one way: integral numbers, the character rules of
identifiers and text, a client-chosen idle timeout, invalid UTF-8 in query parameters, a
repeated `Authorization` header, repeated JSON keys, and tokens hidden in query strings.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, TextDelta
from retrieval_host.core.validation import check_id
from retrieval_host.http.app import HostApp, create_app
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.routes import ingest_media_types
from retrieval_host.http.strict import InvalidRequest, check_unique_keys, key_names
from retrieval_host_client import models as wire
from retrieval_host_client import run_models as run_wire
from retrieval_host_client._errors import HostTimeoutError, error_from_status
from tests.support.host import CORPUS, World, build_world
from tests.support.in_process_runs import RUNNER, add_runs

pytestmark = pytest.mark.anyio


class Stalls:
    """A provider that never makes progress: it waits until its token gives up."""

    kind = "test"

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        stop = threading.Event()
        while not stop.wait(0.001):
            cancel.check()
        yield TextDelta("never")


@pytest.fixture(scope="module")
def rules_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("wire-rules")
    world = build_world(directory, local_embedding)
    close_runs = add_runs(world, directory, {"local": ExtractiveProvider(), "stalls": Stalls()})
    yield world
    close_runs()
    world.close()


@pytest.fixture
def app(rules_world: World) -> HostApp:
    return create_app(rules_world.settings(), rules_world.driver)


@pytest.fixture
async def client(app: HostApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


def _auth(world: World) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[RUNNER]}"}


def _problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert (body["code"], body["status"]) == (code, status)
    return body


def _schema_accepts(pattern: str, value: str) -> bool:
    # JSON Schema patterns are ECMA-262 regexes, unanchored; the ones here mean the same in
    # Python's `re` (no `\s`, no classes that differ between the engines).
    return re.search(pattern, value) is not None


def _openapi() -> dict[str, Any]:
    return build_openapi(version="0", ingest_media_types=ingest_media_types(), runs=True)


# --- integers: an integral number is an integer, everywhere ----------------------------------


def _integer_fields(schema: Any, components: dict[str, Any], path: str = "") -> Iterator[str]:
    if isinstance(schema, dict):
        if "$ref" in schema:
            yield from _integer_fields(
                components[schema["$ref"].rsplit("/", 1)[1]], components, path
            )
            return
        if schema.get("type") == "integer":
            yield path
        for key, value in schema.get("properties", {}).items():
            yield from _integer_fields(value, components, f"{path}.{key}" if path else key)
        for option in schema.get("anyOf", []):
            yield from _integer_fields(option, components, path)
        if "items" in schema:  # an array: `_put` follows its first element
            yield from _integer_fields(schema["items"], components, path)


# The request models that hold integers (a delete request holds none).
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "SearchRequest": wire.SearchRequest,
    "IndexRequest": wire.IndexRequest,
    "RunRequest": run_wire.RunRequest,
}


def _minimal(name: str) -> dict[str, Any]:
    bodies: dict[str, dict[str, Any]] = {
        "SearchRequest": {"corpus": "c", "query": "q"},
        "IndexRequest": {
            "corpus": "c",
            "source": {"id": "s", "revision": "r"},
            "chunks": [{"id": "k", "text": "t", "location": {}}],
        },
        "RunRequest": {"provider": "p", "model": "m", "input": "i", "retrieval": {"corpus": "c"}},
    }
    return bodies[name]


def _put(body: dict[str, Any], path: str, value: object) -> None:
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        node = node[part][0] if isinstance(node[part], list) else node[part]
    node[last] = value


@pytest.mark.parametrize("model_name", sorted(REQUEST_MODELS))
def test_every_integer_field_takes_an_integral_number_as_json_schema_does(
    model_name: str,
) -> None:
    document = _openapi()
    components = document["components"]["schemas"]
    fields = list(_integer_fields(components[model_name], components))
    assert fields, model_name
    model = REQUEST_MODELS[model_name]
    for field in fields:
        body = _minimal(model_name)
        _put(body, field, 2.0)
        raw = model.model_validate(body, by_alias=True).model_dump_json(by_alias=True).encode()
        # The JSON text carries 2.0 (not 2): the host validates the text, strictly.
        text = raw.decode().replace(":2,", ":2.0,").replace(":2}", ":2.0}")
        assert "2.0" in text, (field, text)
        model.model_validate_json(text, strict=True, by_alias=True, by_name=False)
        _put(body, field, 2.5)
        with pytest.raises(ValidationError):
            model.model_validate(body, strict=True, by_alias=True, by_name=False)


async def test_max_generation_steps_takes_an_integral_number_like_limit(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    body = {
        "provider": "local",
        "model": "extractive",
        "input": "How do I rotate a token?",
        "retrieval": {"corpus": CORPUS, "mode": "before", "limit": 3.0, "maxQueries": 1.0},
        "maxGenerationSteps": 2.0,
        "idleTimeoutMs": 600000.0,
    }
    response = await client.post("/v1/runs", json=body, headers=_auth(rules_world))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"


# --- identifiers and text: one character rule each, in the schema and in core ----------------

ID_CASES = [
    ("x", True),
    ("a b", True),
    ("a*", True),
    ("é-id", True),
    ("*", False),  # the wildcard of grants is never an id
    ("a\x00b", False),
    ("a\x1fb", False),
    ("a\x7fb", False),
    ("a\x8cb", False),  # C1 control
    ("a\x85b", False),  # C1 control (also whitespace in Python)
    (" x", False),
    ("x\u2028", False),
]


@pytest.mark.parametrize(("value", "valid"), ID_CASES, ids=repr)
def test_an_identifier_follows_one_rule_in_the_schema_and_in_core(value: str, valid: bool) -> None:
    assert _schema_accepts(wire.IDENTIFIER_PATTERN, value) is valid
    if valid:
        check_id("source id", value)
    else:
        with pytest.raises(RetrievalError) as caught:
            check_id("source id", value)
        assert caught.value.code is ErrorCode.INVALID_REQUEST


async def test_the_host_refuses_exactly_the_identifiers_the_schema_refuses(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    auth = _auth(rules_world)
    for value, valid in ID_CASES:
        index = {
            "corpus": CORPUS,
            "source": {"id": value, "revision": "r1"},
            "chunks": [{"id": f"rules-{len(value)}-{ord(value[-1])}", "text": "Some text."}],
        }
        indexed = await client.post("/v1/retrieval/index", json=index, headers=auth)
        assert (indexed.status_code == 200) is valid, (value, indexed.text)
        delete = {"corpus": CORPUS, "sourceId": value, "revision": "r1"}
        deleted = await client.post("/v1/retrieval/delete", json=delete, headers=auth)
        assert (deleted.status_code == 200) is valid, (value, deleted.text)
        search = {"corpus": CORPUS, "query": "text", "sourceIds": [value]}
        searched = await client.post("/v1/retrieval/search", json=search, headers=auth)
        assert (searched.status_code in (200, 404)) is valid, (value, searched.text)
        ingested = await client.post(
            "/v1/retrieval/ingest",
            params={"corpus": CORPUS, "sourceId": value},
            content=b"# A note\n\nSome text.\n",
            headers={**auth, "Content-Type": "text/markdown"},
        )
        assert (ingested.status_code == 200) is valid, (value, ingested.text)


def test_a_source_named_star_cannot_be_indexed_in_process(rules_world: World) -> None:
    from retrieval_host.core.context import RequestContext
    from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo

    request = IndexRequest(
        CORPUS, SourceInfo("*", "r1", "Star"), [ChunkInput("star-1", "text", Location())]
    )
    with pytest.raises(RetrievalError) as caught:
        rules_world.driver.index_context(request, RequestContext("admin"))
    assert caught.value.code is ErrorCode.INVALID_REQUEST


TEXT_CASES = [
    ("plain", True),
    ("tab\tand\nnewline\x0cform feed", True),
    ("a \x8c C1 control in prose", True),
    ("a\x00NUL", False),
]


@pytest.mark.parametrize(("value", "valid"), TEXT_CASES, ids=repr)
async def test_passage_text_follows_one_rule_in_the_schema_and_the_host(
    client: httpx.AsyncClient, rules_world: World, value: str, valid: bool
) -> None:
    components = _openapi()["components"]["schemas"]
    pattern = components["ChunkInput"]["properties"]["text"]["pattern"]
    assert _schema_accepts(pattern, value) is valid
    index = {
        "corpus": CORPUS,
        "source": {"id": "text-rule", "revision": f"r{len(value)}"},
        "chunks": [{"id": f"text-rule-{len(value)}", "text": value}],
    }
    response = await client.post("/v1/retrieval/index", json=index, headers=_auth(rules_world))
    assert (response.status_code == 200) is valid, response.text
    if not valid:
        _problem(response, 422, "INVALID_REQUEST")


@pytest.mark.parametrize(
    ("query", "valid"),
    [
        ("Which quay? " + "q" * 6_000, True),  # a paragraph (2,048 characters were refused)
        ("q" * 8_192, True),
        ("q" * 8_193, False),
        ("港" * 2_730, True),  # 8,190 bytes
        ("港" * 2_731, False),  # 2,731 characters, 8,193 bytes
    ],
    ids=["paragraph", "8192-ascii", "8193-ascii", "8190-bytes-cjk", "8193-bytes-cjk"],
)
async def test_a_query_is_bounded_by_its_utf8_bytes_in_the_schema_and_the_host(
    client: httpx.AsyncClient, rules_world: World, query: str, valid: bool
) -> None:
    # A black-box test: ArguAna-shaped questions (a whole argument) passed in-process and
    # were refused over HTTPS past 2,048 characters.
    try:
        wire.SearchRequest(corpus=CORPUS, query=query)
        schema_valid = True
    except ValidationError:
        schema_valid = False
    assert schema_valid is valid
    body = {"corpus": CORPUS, "query": query}
    response = await client.post("/v1/retrieval/search", json=body, headers=_auth(rules_world))
    assert (response.status_code == 200) is valid, response.text
    if not valid:
        _problem(response, 422, "INVALID_REQUEST")


# --- a client-chosen idle timeout is the client's limit: 408, not a 5xx ----------------------


async def test_an_expired_idle_timeout_the_client_chose_is_a_4xx(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    body = {"provider": "stalls", "model": "m", "input": "Anything?", "idleTimeoutMs": 1}
    response = await client.post("/v1/runs", json=body, headers=_auth(rules_world))
    problem = _problem(response, 408, "TIMEOUT")
    assert problem["reason"] == "idle-timeout"
    streamed = await client.post(
        "/v1/runs", json=body, headers={**_auth(rules_world), "Accept": "text/event-stream"}
    )
    assert streamed.status_code == 200
    assert '"status": 408' in streamed.text and '"reason": "idle-timeout"' in streamed.text
    # The client's mirror: the status alone (no problem body) picks the same class.
    assert isinstance(error_from_status(408), HostTimeoutError)
    assert "504" not in _openapi()["paths"]["/v1/runs"]["post"]["responses"]


async def test_a_spent_generation_step_budget_the_client_chose_is_a_4xx(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    # Found by the fuzz stage: in tool mode the first model call asks for a search, so one step
    # cannot produce an answer; the budget is the client's, the answer was a 502.
    body = {
        "provider": "local",
        "model": "extractive",
        "input": "How do I rotate a token?",
        "retrieval": {"corpus": CORPUS, "mode": "tool"},
        "maxGenerationSteps": 1,
    }
    response = await client.post("/v1/runs", json=body, headers=_auth(rules_world))
    problem = _problem(response, 422, "INVALID_REQUEST")
    assert problem["reason"] == "step-budget-exhausted"
    body["maxGenerationSteps"] = 2
    response = await client.post("/v1/runs", json=body, headers=_auth(rules_world))
    assert response.status_code == 200, response.text


# --- query parameters: valid UTF-8, each once ---------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        f"corpus={CORPUS}&sourceId=caf%E9",  # Latin-1, not UTF-8
        f"corpus={CORPUS}&sourceId=caf%C3",  # a truncated sequence
        f"corpus={CORPUS}&sourceId=x&title=%FF",
    ],
)
async def test_invalid_utf8_in_a_query_parameter_is_400(
    client: httpx.AsyncClient, rules_world: World, query: str
) -> None:
    response = await client.post(
        f"/v1/retrieval/ingest?{query}",
        content=b"# x\n\ntext\n",
        headers={**_auth(rules_world), "Content-Type": "text/markdown"},
    )
    assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "invalid-utf8"


async def test_a_repeated_query_parameter_is_400(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    response = await client.post(
        f"/v1/retrieval/ingest?corpus={CORPUS}&sourceId=a&sourceId=b",
        content=b"# x\n\ntext\n",
        headers={**_auth(rules_world), "Content-Type": "text/markdown"},
    )
    assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "duplicate-parameter"


async def test_a_route_that_reads_no_query_parameter_refuses_one(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    # Probe A (session 37): `/v1/corpora?limit=5` answered every corpus, as if understood,
    # where the other GET routes refuse a parameter they do not know.
    response = await client.get("/v1/corpora", params={"limit": "5"}, headers=_auth(rules_world))
    assert _problem(response, 422, "INVALID_REQUEST")["detail"] == (
        "This route takes no query parameters."
    )
    assert (await client.get("/v1/corpora", headers=_auth(rules_world))).status_code == 200
    response = await client.get("/v1/runs/run_x", params={"x": "1"}, headers=_auth(rules_world))
    assert _problem(response, 422, "INVALID_REQUEST")["detail"] == (
        "This route takes no query parameters."
    )
    # And the document says so (probe A, session 39: both answered a 422 it did not declare).
    paths = _openapi()["paths"]
    assert "422" in paths["/v1/corpora"]["get"]["responses"]
    assert "422" in paths["/v1/runs/{runId}"]["get"]["responses"]


# --- one Authorization header -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/retrieval/search", "/metrics"])
async def test_two_authorization_headers_are_400(
    client: httpx.AsyncClient, rules_world: World, path: str
) -> None:
    good = f"Bearer {rules_world.tokens[RUNNER]}"
    for pair in ((good, "Bearer nonsense"), ("Bearer nonsense", good), (good, good)):
        headers = httpx.Headers([("Authorization", pair[0]), ("Authorization", pair[1])])
        if path == "/metrics":
            response = await client.get(path, headers=headers)
        else:
            response = await client.post(
                path, json={"corpus": CORPUS, "query": "tokens"}, headers=headers
            )
        problem = _problem(response, 400, "INVALID_REQUEST")
        assert problem["reason"] == "duplicate-authorization"


# --- JSON objects: each key once, at any depth --------------------------------------------------


async def _post_json(
    client: httpx.AsyncClient, world: World, path: str, raw: str
) -> httpx.Response:
    """`raw` as the JSON body of a POST, sent as written (keys twice, non-JSON numbers)."""
    return await client.post(
        path,
        content=raw.encode(),
        headers={**_auth(world), "Content-Type": "application/json"},
    )


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/retrieval/search", '{"corpus": "library", "query": "a", "query": "b"}'),
        ("/v1/retrieval/search", '{"corpus": "nope", "query": "a", "corpus": "library"}'),
        ("/v1/retrieval/search", '{"corpus": "library", "query": "a", "corp\\u0075s": "library"}'),
        (
            "/v1/retrieval/search",
            '{"corpus": "library", "query": "a", "filters": {"lang": "en", "lang": "de"}}',
        ),
        (
            "/v1/retrieval/index",
            '{"corpus": "library", "source": {"id": "d", "revision": "1", "id": "e"},'
            ' "chunks": [{"id": "d-1", "text": "t"}]}',
        ),
        (
            "/v1/retrieval/index",
            '{"corpus": "library", "source": {"id": "d", "revision": "1"},'
            ' "chunks": [{"id": "d-1", "text": "t", "location": {"page": 1, "page": 2}}]}',
        ),
        (
            "/v1/retrieval/index",
            '{"corpus": "library", "source": {"id": "d", "revision": "1",'
            ' "metadata": {"a": {"b": 1, "b": 2}}}, "chunks": [{"id": "d-1", "text": "t"}]}',
        ),
        (
            "/v1/runs",
            '{"provider": "local", "model": "m", "input": "q",'
            ' "retrieval": {"corpus": "library", "mode": "off", "mode": "before"}}',
        ),
    ],
)
async def test_a_repeated_json_key_at_any_depth_is_400(
    client: httpx.AsyncClient, rules_world: World, path: str, raw: str
) -> None:
    response = await _post_json(client, rules_world, path, raw)
    assert _problem(response, 400, "INVALID_REQUEST")["reason"] == "duplicate-key"


async def test_equal_keys_in_different_objects_are_not_duplicates(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    raw = (
        '{"corpus": "library", "source": {"id": "twins", "revision": "1", "metadata": {"id": 1}},'
        ' "chunks": [{"id": "twins-1", "text": "one"}, {"id": "twins-2", "text": "two"}]}'
    )
    response = await _post_json(client, rules_world, "/v1/retrieval/index", raw)
    assert response.status_code == 200, response.text
    # A string value that looks like a key is not a key.
    tricky = '{"corpus": "library", "query": "\\"corpus\\": x", "limit": 1}'
    response = await _post_json(client, rules_world, "/v1/retrieval/search", tricky)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/retrieval/search", '{"corpus": "library", "query": "a", "limit": NaN}'),
        ("/v1/retrieval/search", '{"corpus": "library", "query": "a", "minScore": -Infinity}'),
        ("/v1/retrieval/search", '{"corpus": "library", "query": "a", "filters": {"x": NaN}}'),
        (
            "/v1/retrieval/index",
            '{"corpus": "library", "source": {"id": "d", "revision": "1",'
            ' "metadata": {"w": Infinity}}, "chunks": [{"id": "d-1", "text": "t"}]}',
        ),
    ],
)
async def test_nan_and_infinity_are_not_json_so_a_body_holding_one_is_400(
    client: httpx.AsyncClient, rules_world: World, path: str, raw: str
) -> None:
    # Probe B: the model's parser read them as numbers, and the answer was 422 (a wrong value)
    # where a body that is not JSON is 400.
    response = await _post_json(client, rules_world, path, raw)
    assert "NaN and Infinity" in _problem(response, 400, "INVALID_REQUEST")["detail"]
    # In a string they are text.
    text = '{"corpus": "library", "query": "NaN or -Infinity", "limit": 1}'
    response = await _post_json(client, rules_world, "/v1/retrieval/search", text)
    assert response.status_code == 200, response.text


# --- a token anywhere in the query string is refused --------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "x=Bearer%20{token}",
        "x=Bearer+{token}",
        "x=bearer%20{token}",
        "x={token}%20",
        "x=%20{token}",
        "x=%09{token}",
        "{token}=1",
        "{token}",
        "x=1&{token}",
        "x=%22{token}%22",  # quoted
        "x={token}&y=2",
    ],
)
async def test_a_token_anywhere_in_the_query_string_is_refused(
    client: httpx.AsyncClient, rules_world: World, template: str
) -> None:
    token = rules_world.tokens[RUNNER]
    query = template.format(token=token)
    response = await client.post(
        f"/v1/retrieval/search?{query}",
        json={"corpus": CORPUS, "query": "tokens"},
        headers=_auth(rules_world),
    )
    assert _problem(response, 401, "UNAUTHENTICATED")["reason"] == "token-in-query"


async def test_an_ordinary_query_string_passes_the_token_check(
    client: httpx.AsyncClient, rules_world: World
) -> None:
    response = await client.post(
        "/v1/retrieval/ingest",
        params={"corpus": CORPUS, "sourceId": "plain-note", "title": "Bearer of news"},
        content=b"# A note\n\nPlain text.\n",
        headers={**_auth(rules_world), "Content-Type": "text/markdown"},
    )
    assert response.status_code == 200, response.text


# Documents shaped like what SearchRequest accepts (the fast check's precondition): its own
# fields at the top, free keys only inside `filters`; escapes and repeats drawn often.
_fields = st.sampled_from(
    ["corpus", "query", "limit", "sourceIds", "maxContextBytes", "q\\u0075ery"]
)
_scalars = st.sampled_from(['"library"', '"query"', '"a\\"b"', "1", "2.0", "true", "null", '"x"'])
_free = st.sampled_from(["lang", "x", "corpus", "l\\u0061ng"])


def _object(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f'"{key}": {value}' for key, value in pairs) + "}"


_field_values = _scalars | st.lists(_scalars, max_size=3).map(lambda v: "[" + ", ".join(v) + "]")
_filters = st.lists(st.tuples(_free, _scalars), max_size=4).map(_object)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    pairs=st.lists(st.tuples(_fields, _field_values), max_size=6),
    filters=st.lists(_filters, max_size=2),
)
def test_the_fast_duplicate_check_never_clears_a_repeated_key(
    pairs: list[tuple[str, str]], filters: list[str]
) -> None:
    pairs = pairs + [("filters", f) for f in filters]
    raw = _object(pairs).encode()
    objects: list[list[tuple[str, object]]] = []

    def record(found: list[tuple[str, object]]) -> dict[str, object]:
        objects.append(found)
        return dict(found)

    json.loads(raw, object_pairs_hook=record)
    repeated = any(len({key for key, _ in found}) != len(found) for found in objects)
    if repeated:
        with pytest.raises(InvalidRequest) as caught:
            check_unique_keys(raw)
        assert caught.value.reason == "duplicate-key"
        assert not key_names(wire.SearchRequest).rule_out_duplicates(raw), raw
    else:
        check_unique_keys(raw)

"""Schemathesis against /v1/openapi.json: every operation, all checks, 100 examples each.

Runs in process (ASGI) through schemathesis's Python API: each operation's positive strategy
(and, where it takes input, its negative one) drives 100 Hypothesis examples, and every
response goes through `case.call_and_validate` with all built-in checks (no 5xx, status codes,
content types, headers and bodies as documented, auth enforced, valid data accepted, invalid
data rejected).

Positive cases are steered into the one real corpus so they reach the service (embedding,
store, authorizer) instead of stopping at the token's corpus grant; negative cases are left as
generated. For valid data, the statuses a request can still get for reasons a schema cannot
express (a source that does not exist, a revision conflict, a corpus capacity, a passage
longer than the embedding model reads, an unparsable document) are accepted; nothing else is.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.openapi import from_asgi

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.http.app import create_app
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.routes import ingest_media_types
from tests.support.host import CORPUS, World, build_world

EXAMPLES = 100

for _media_type in ("text/markdown", "message/rfc822", "application/mbox"):
    schemathesis.serializer.alias(_media_type, "text/plain")
schemathesis.serializer.alias("application/pdf", "application/octet-stream")

CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "413", "422"]},
            "negative_data_rejection": {
                "expected-statuses": ["400", "401", "403", "404", "405", "409", "413", "415", "422"]
            },
        }
    }
)


# What a schema-valid request may get, per route, besides success: a missing source (404); a
# revision conflict (409); a corpus capacity (413); relations JSON Schema cannot state, such as
# unique chunk ids or endLine >= startLine, and documents that do not parse (422).
POSITIVE_STATUSES = {
    "/v1/protocol": {200},
    "/v1/openapi.json": {200},
    "/healthz": {200},
    "/readyz": {200},
    "/v1/retrieval/search": {200, 404},
    "/v1/retrieval/index": {200, 409, 413, 422},
    "/v1/retrieval/ingest": {200, 409, 413, 422},
    "/v1/retrieval/delete": {200, 404},
}


def _operations() -> list[tuple[str, str, str]]:
    document = build_openapi(version="0", ingest_media_types=ingest_media_types())
    found = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            found.append((path, method, "positive"))
            if "requestBody" in operation or operation.get("parameters"):
                found.append((path, method, "negative"))
    return found


@pytest.fixture(scope="module")
def fuzz_world(tmp_path_factory: pytest.TempPathFactory, http_embedding: LocalEmbedding) -> Any:
    world = build_world(tmp_path_factory.mktemp("fuzz-world"), http_embedding)
    yield world
    world.close()


@pytest.fixture(scope="module")
def api_schema(fuzz_world: World) -> Any:
    app = create_app(fuzz_world.settings(), fuzz_world.driver)
    return from_asgi("/v1/openapi.json", app, config=CONFIG)


@pytest.mark.parametrize(
    ("path", "method", "mode"),
    _operations(),
    ids=lambda value: str(value),
)
def test_every_operation_conforms_to_its_openapi(
    api_schema: Any, fuzz_world: World, path: str, method: str, mode: str
) -> None:
    operation = api_schema[path][method.upper()]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))
    auth = {"Authorization": f"Bearer {fuzz_world.tokens['admin']}"}
    calls = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        if mode == "positive":
            if isinstance(case.body, dict) and "corpus" in case.body:
                case.body["corpus"] = CORPUS
            if isinstance(case.query, dict) and "corpus" in case.query:
                case.query["corpus"] = CORPUS
        response = case.call_and_validate(headers=auth)
        calls.append(response.status_code)
        if mode == "positive":
            # Stricter than the shared config: only what each operation can meet with valid data.
            assert response.status_code in POSITIVE_STATUSES[path], response.text

    check()
    # Operations without input have a single possible request; the others get every example.
    assert len(calls) == (EXAMPLES if mode == "negative" or method == "post" else 1)

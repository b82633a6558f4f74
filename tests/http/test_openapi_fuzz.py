"""Schemathesis against /v1/openapi.json: every operation, runs included, all checks.

Runs in process (ASGI) through schemathesis's Python API: each operation's positive strategy
(and, where it takes input, its negative one) drives 100 Hypothesis examples, and every
response goes through `case.call_and_validate` with all built-in checks (no 5xx, status codes,
content types, headers and bodies as documented, auth enforced, valid data accepted, invalid
data rejected).

`pin_to_grants` is the hook that makes positive cases reach the core (embedding, store,
authorizer, run engine) instead of stopping at the token's grants: it pins every `corpus`
(also a run's `retrieval.corpus`) to the granted corpus and a run's `provider` to the granted
extractive provider, and, when Hypothesis draws so, points a search's `sourceIds` at the
seeded source, a delete at a source it indexes first, and a run lookup at a recorded run.
An inspection route's `corpus` is pinned the same way, its `sourceId` or `chunkId`
sometimes to the seeded source, and a generated `cursor` (valid only when the host made it) is
dropped. Negative cases are left as generated. For valid data, the statuses a request can still get
for reasons a schema cannot express (a source that does not exist, a revision conflict, a
corpus capacity, a passage longer than the embedding model reads, an unparsable document, no
evidence for a run, the run's own idle timeout) are accepted; nothing else is.

Derandomized and bounded: 1,204 cases, about 1-2 minutes on the CI machine.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.openapi import from_asgi

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.runs_model import RunRequest, RunRetrieval
from retrieval_host.http.app import create_app
from retrieval_host.http.openapi import build_openapi
from retrieval_host.http.routes import ingest_media_types
from retrieval_host.serving.tokens import new_token, token_config_entry
from tests.support.host import CORPUS, World, build_world
from tests.support.in_process_runs import RUNNER, add_runs

EXAMPLES = 100
PROVIDER = "local"  # the extractive provider: the whole run path, no network
SEEDED_SOURCE = "handbook"  # indexed by `build_world`
DELETABLE_SOURCE = "fuzz-deletable"  # indexed again before each pinned delete

for _media_type in ("text/markdown", "text/html", "message/rfc822", "application/mbox"):
    schemathesis.serializer.alias(_media_type, "text/plain")
schemathesis.serializer.alias("application/pdf", "application/octet-stream")

CONFIG = schemathesis.Config.from_dict(
    {
        # Schemathesis's default of 10 s per call is a timing assertion: an ingest (the local
        # model) took longer on a machine whose cores ran 8 busy loops (session 40).
        "request-timeout": 120,
        "checks": {
            "enabled": True,  # every built-in check, stated rather than left to the default
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "404", "408", "409", "413", "422"]
            },
            "negative_data_rejection": {
                "expected-statuses": ["400", "401", "403", "404", "405", "409", "413", "415", "422"]
            },
        },
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
    # An ingest may also outlive the idle timeout it chose itself (408).
    "/v1/retrieval/ingest": {200, 408, 409, 413, 422},
    # A delete may also name another revision of a source an earlier case indexed (409
    # `stale-revision`).
    "/v1/retrieval/delete": {200, 404, 409},
    # A run may also find no evidence or meet relations the schema cannot state (422), name
    # an unavailable source (404), replay a failed run's key (409), or outlive the idle
    # timeout it chose itself (408).
    "/v1/runs": {200, 404, 408, 409, 422},
    "/v1/runs/{runId}": {200, 404},
    # Inspection: a source or passage that does not exist (404).
    "/v1/corpora": {200},
    "/v1/corpora/{corpus}/sources": {200},
    "/v1/corpora/{corpus}/sources/{sourceId}": {200, 404},
    "/v1/corpora/{corpus}/passages/{chunkId}": {200, 404},
    "/metrics": {200},  # called with the scraper's token (the runner's would get 403)
}
SCRAPER = "scraper"  # a token with the metrics grant only


def _operations() -> list[tuple[str, str, str]]:
    document = build_openapi(version="0", ingest_media_types=ingest_media_types(), runs=True)
    found = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            found.append((path, method, "positive"))
            if "requestBody" in operation or operation.get("parameters"):
                found.append((path, method, "negative"))
    return found


@pytest.fixture(scope="module")
def fuzz_world(tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding) -> Any:
    directory = tmp_path_factory.mktemp("fuzz-world")
    world = build_world(directory, local_embedding)
    close_runs = add_runs(world, directory, {PROVIDER: ExtractiveProvider()})
    world.tokens[SCRAPER] = new_token()
    world.token_entries.append(
        {**token_config_entry(world.tokens[SCRAPER], "prom"), "metrics": True}
    )
    yield world
    close_runs()
    world.close()


@pytest.fixture(scope="module")
def recorded_run(fuzz_world: World) -> str:
    """The id of a completed run of the fuzzing token's subject."""
    assert fuzz_world.driver.runs is not None
    request = RunRequest(
        PROVIDER, "extractive", "How do I rotate a token?", RunRetrieval(CORPUS, "before")
    )
    return fuzz_world.driver.runs.run(request, RequestContext("admin")).run_id


def _seed_deletable(world: World) -> None:
    """(Re-)index the source a pinned delete removes (`unchanged` while it is still there)."""
    world.driver.index_context(
        IndexRequest(
            CORPUS,
            SourceInfo(DELETABLE_SOURCE, "r1", "Deletable"),
            [ChunkInput(f"{DELETABLE_SOURCE}-1", "A passage the fuzzer deletes.", Location())],
        ),
        RequestContext("admin"),
    )


def pin_to_grants(case: Any, data: st.DataObject, world: World, recorded_run: str) -> None:
    """Steer a positive case into what the fuzzing token is granted (see the module doc)."""
    body = case.body if isinstance(case.body, dict) else None
    if body is not None:
        if "sourceId" in body and data.draw(st.booleans(), label="seeded delete"):
            _seed_deletable(world)
            body["sourceId"], body["revision"] = DELETABLE_SOURCE, "r1"
        if "corpus" in body:
            body["corpus"] = CORPUS
        if "provider" in body:
            body["provider"] = PROVIDER
        if "model" in body:
            body["model"] = "extractive"  # the one model this world's provider serves
        if isinstance(body.get("retrieval"), dict):
            body["retrieval"]["corpus"] = CORPUS
        # This world's corpus has no reranker: insisting on one is refused by design (422
        # `rerank-unavailable`), so valid data leaves the choice to the corpus.
        for spec in (body, body.get("retrieval")):
            if isinstance(spec, dict) and spec.get("rerank") is True:
                spec["rerank"] = None
        if body.get("sourceIds") and data.draw(st.booleans(), label="seeded sourceIds"):
            body["sourceIds"] = [SEEDED_SOURCE]
    if isinstance(case.query, dict) and "corpus" in case.query:
        case.query["corpus"] = CORPUS
    parameters = case.path_parameters if isinstance(case.path_parameters, dict) else {}
    if "runId" in parameters and data.draw(st.booleans(), label="recorded runId"):
        parameters["runId"] = recorded_run
    if "corpus" in parameters:
        parameters["corpus"] = CORPUS
    if "sourceId" in parameters and data.draw(st.booleans(), label="seeded sourceId"):
        parameters["sourceId"] = SEEDED_SOURCE
    if "chunkId" in parameters and data.draw(st.booleans(), label="seeded chunkId"):
        parameters["chunkId"] = f"{SEEDED_SOURCE}-0"
    if isinstance(case.query, dict) and "cursor" in case.query:
        # A cursor is opaque: only one the host returned is valid (any other is a 400).
        del case.query["cursor"]


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
    api_schema: Any, fuzz_world: World, recorded_run: str, path: str, method: str, mode: str
) -> None:
    operation = api_schema[path][method.upper()]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))
    token = fuzz_world.tokens[SCRAPER if path == "/metrics" else RUNNER]
    auth = {"Authorization": f"Bearer {token}"}
    calls = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, data=st.data())
    def check(case: Any, data: st.DataObject) -> None:
        if mode == "positive":
            pin_to_grants(case, data, fuzz_world, recorded_run)
        response = case.call_and_validate(headers=auth)
        calls.append(response.status_code)
        if mode == "positive":
            # Stricter than the shared config: only what each operation can meet with valid data.
            assert response.status_code in POSITIVE_STATUSES[path], response.text

    check()
    # Operations without input have a single possible request; the others get every example.
    # A secured GET without parameters (`/v1/corpora`, `/metrics`) still varies: schemathesis
    # draws the bearer credential its security scheme names (ours replaces it).
    takes_input = method == "post" or "{" in path or path in ("/v1/corpora", "/metrics")
    assert len(calls) == (EXAMPLES if takes_input else 1)
    if mode == "positive":
        # The pinning works: valid cases reach the core and some succeed.
        assert 200 in calls, calls

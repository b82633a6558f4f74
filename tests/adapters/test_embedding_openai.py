"""OpenAIEmbedding against a real loopback HTTP server speaking the OpenAI wire format."""

from __future__ import annotations

import contextlib
import json
import socket
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import trustme

from retrieval_host.adapters.embedding_openai import OpenAIEmbedding, estimate_tokens
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import (
    ChunkInput,
    EmbeddingUsage,
    IndexRequest,
    Location,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.support.adapter_factory import closing_factory
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    FakeOpenAI,
    Mode,
    RecordedRequest,
    Reply,
    fake_token_count,
    fake_vector,
    json_reply,
    openai_error,
)

MODEL = "text-embedding-3-small"
DIMS = 64
TEXTS = ["alpha passage", "beta passage", "gamma passage"]


def descriptor(**overrides: object) -> EmbeddingDescriptor:
    fields: dict[str, object] = {
        "provider_id": "openai-main",
        "vendor": "openai",
        "account_id": "research-account",
        "auth_mode": "api-key",
        "model": MODEL,
        "dimensions": DIMS,
    }
    fields.update(overrides)
    return EmbeddingDescriptor(**fields)  # type: ignore[arg-type]


def expected(
    texts: Sequence[str], *, model: str = MODEL, dims: int | None = DIMS
) -> npt.NDArray[np.float32]:
    """What the fake returns for `texts` (it serves every model natively at 1536)."""
    return np.array([fake_vector(model, t, 1536, dims) for t in texts], dtype=np.float32)


Factory = Callable[..., OpenAIEmbedding]


@pytest.fixture
def make(server: FakeOpenAI) -> Iterator[Factory]:
    """`make(**overrides)`: an adapter for `server` with `descriptor()` and the key."""
    with closing_factory(
        OpenAIEmbedding,
        descriptor=descriptor(),
        base_url=server.base_url,
        api_key=lambda: DEFAULT_API_KEY,
    ) as factory:
        yield factory


def fail(adapter: OpenAIEmbedding, texts: Sequence[str] = TEXTS) -> RetrievalError:
    with pytest.raises(RetrievalError) as info:
        adapter.embed(texts, CancelToken())
    return info.value


def embeddings_requests(server: FakeOpenAI) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/embeddings"]


# --- the happy path ----------------------------------------------------------------------


def test_embeds_in_input_order_as_unit_float32_rows(server: FakeOpenAI, make: Factory) -> None:
    batch = make().embed(TEXTS, CancelToken())

    assert batch.vectors.dtype == np.float32
    assert batch.vectors.shape == (3, DIMS)
    np.testing.assert_allclose(np.linalg.norm(batch.vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(batch.vectors, expected(TEXTS), atol=1e-6)
    assert batch.usage == EmbeddingUsage(
        requests=1, input_tokens=sum(fake_token_count(t) for t in TEXTS)
    )


def test_sends_the_openai_request_shape_with_a_bearer_key(
    server: FakeOpenAI, make: Factory
) -> None:
    make().embed(TEXTS, CancelToken())

    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/v1/embeddings")
    assert request.headers["authorization"] == f"Bearer {DEFAULT_API_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.json == {
        "model": MODEL,
        "input": TEXTS,
        "encoding_format": "float",
        "dimensions": DIMS,
    }


def test_orders_vectors_by_the_response_index_not_by_position(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("shuffled")
    batch = make().embed(TEXTS, CancelToken())
    np.testing.assert_allclose(batch.vectors, expected(TEXTS), atol=1e-6)


def test_normalises_vectors_the_server_did_not_normalise(server: FakeOpenAI, make: Factory) -> None:
    def scaled(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        data = [
            {"object": "embedding", "index": i, "embedding": [3.0 * (j + 1) for j in range(DIMS)]}
            for i in range(len(request.json["input"]))
        ]
        return json_reply(200, {"object": "list", "data": data, "model": MODEL})

    server.route("POST", "/v1/embeddings", scaled)
    vectors = make().embed(["one"], CancelToken()).vectors

    raw = np.arange(1, DIMS + 1, dtype=np.float64)
    np.testing.assert_allclose(vectors[0], raw / np.linalg.norm(raw), rtol=1e-6)


def test_an_empty_input_makes_no_request(server: FakeOpenAI, make: Factory) -> None:
    batch = make().embed([], CancelToken())
    assert batch.vectors.shape == (0, DIMS)
    assert batch.usage == EmbeddingUsage()
    assert server.requests_count == 0


def test_reports_zero_input_tokens_when_the_server_reports_no_usage(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("no-usage")
    assert make().embed(TEXTS, CancelToken()).usage == EmbeddingUsage(requests=1, input_tokens=0)


def test_reads_the_api_key_at_each_request(server: FakeOpenAI, make: Factory) -> None:
    keys = iter([DEFAULT_API_KEY, "sk-rotated-key-abcdefghijklmnop"])
    adapter = make(api_key=lambda: next(keys))
    adapter.embed(["one"], CancelToken())
    error = fail(adapter, ["two"])

    assert [r.headers["authorization"] for r in server.requests] == [
        f"Bearer {DEFAULT_API_KEY}",
        "Bearer sk-rotated-key-abcdefghijklmnop",
    ]
    assert error.reason == "http-error"
    assert "401" in error.detail


def test_without_a_key_sends_no_authorization_header(make: Factory) -> None:
    with FakeOpenAI(api_key=None) as open_server:
        adapter = make(
            descriptor=descriptor(auth_mode="none"), base_url=open_server.base_url, api_key=None
        )
        adapter.embed(["one"], CancelToken())
        (request,) = open_server.requests
    assert "authorization" not in request.headers


def test_accepts_a_ca_bundle_path_for_verify(
    server: FakeOpenAI, make: Factory, tmp_path: Path
) -> None:
    ca_file = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))
    # A path goes through ssl.create_default_context (httpx deprecates str paths, and
    # warnings are errors here); the plain-HTTP loopback call proves the client still works.
    batch = make(verify=str(ca_file)).embed(["one"], CancelToken())
    assert batch.usage.requests == 1


# --- rejections --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("wrong-model", "model-mismatch"),
        # A dated or suffixed name is another build of the model: its vectors are not
        # comparable with the corpus, so it is refused like any other name.
        ("dated-model", "model-mismatch"),
        ("no-model", "model-mismatch"),
        ("wrong-dims", "dimensions-mismatch"),
        ("duplicate-index", "duplicate-index"),
        ("missing-index", "missing-index"),
        ("extra-index", "extra-index"),
        ("nan", "non-finite-value"),
        ("infinity", "non-finite-value"),
        ("zero-vector", "zero-vector"),
        ("string-values", "non-float-value"),
        ("base64-values", "non-float-value"),
        ("bool-index", "malformed-response"),
        ("malformed-json", "malformed-response"),
        ("wrong-shape", "malformed-response"),
        ("server-error", "http-error"),
        ("html-error", "http-error"),
        ("rate-limited", "rate-limited"),
        ("reject-dimensions", "dimensions-unsupported"),
        ("drop-connection", "connection-failed"),
    ],
)
def test_rejects_a_bad_response_once_without_retrying(
    server: FakeOpenAI, make: Factory, mode: Mode, reason: str
) -> None:
    server.set_mode(mode)
    error = fail(make())
    assert error.code is ErrorCode.EMBEDDING_FAILED
    assert error.reason == reason
    assert server.requests_count == 1


def test_a_model_mismatch_names_both_models(server: FakeOpenAI, make: Factory) -> None:
    server.set_mode("dated-model")
    error = fail(make())
    assert "'text-embedding-3-small-2024-01-25'" in error.detail
    assert f"configured model {MODEL!r}" in error.detail


def test_an_http_error_names_the_status_and_the_server_message(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("rate-limited")
    error = fail(make())
    assert "HTTP 429" in error.detail
    assert "Rate limit reached for text-embedding-3-small" in error.detail


def test_an_html_error_page_is_not_copied_into_the_detail(
    server: FakeOpenAI, make: Factory
) -> None:
    server.set_mode("html-error")
    error = fail(make())
    assert "HTTP 502" in error.detail
    assert "<html>" not in error.detail


def test_a_long_server_message_is_truncated_to_one_line(server: FakeOpenAI, make: Factory) -> None:
    message = "first line\nsecond " + "x" * 5000

    def verbose(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        return openai_error(503, message, type_="server_error")

    server.route("POST", "/v1/embeddings", verbose)
    error = fail(make())
    assert error.detail.startswith("the embedding service answered HTTP 503: first line second ")
    assert "\n" not in error.detail
    assert len(error.detail) < 300


def test_a_dimensions_rejection_suggests_send_dimensions_false(
    server: FakeOpenAI, make: Factory
) -> None:
    ada = descriptor(model="text-embedding-ada-002", dimensions=1536)
    error = fail(make(descriptor=ada))
    assert error.reason == "dimensions-unsupported"
    assert "send_dimensions=False" in error.detail


def test_rejects_integers_beyond_float_range(server: FakeOpenAI, make: Factory) -> None:
    def huge(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        vector = ", ".join(["0.5"] * (DIMS - 1) + ["1" + "0" * 400])
        body = f'{{"data": [{{"index": 0, "embedding": [{vector}]}}], "model": "{MODEL}"}}'
        return Reply(200, body.encode())

    server.route("POST", "/v1/embeddings", huge)
    assert fail(make(), ["one"]).reason == "non-finite-value"


def test_rejects_values_that_overflow_float32(server: FakeOpenAI, make: Factory) -> None:
    def overflow(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        data = [{"index": 0, "embedding": [0.5] * (DIMS - 1) + [1e39]}]
        return json_reply(200, {"data": data, "model": MODEL})

    server.route("POST", "/v1/embeddings", overflow)
    assert fail(make(), ["one"]).reason == "non-finite-value"


def test_rejects_a_response_far_larger_than_the_batch_needs(
    server: FakeOpenAI, make: Factory
) -> None:
    def bloated(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        return Reply(200, b" " * (3 * 1024 * 1024))

    server.route("POST", "/v1/embeddings", bloated)
    assert fail(make(), ["one"]).reason == "malformed-response"


def test_rejects_malformed_usage(server: FakeOpenAI, make: Factory) -> None:
    def bad_usage(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        data = [{"index": 0, "embedding": fake_vector(MODEL, "one", 1536, DIMS)}]
        return json_reply(200, {"data": data, "model": MODEL, "usage": {"prompt_tokens": "7"}})

    server.route("POST", "/v1/embeddings", bad_usage)
    assert fail(make(), ["one"]).reason == "malformed-response"


def test_times_out_on_a_slow_server_without_retrying(server: FakeOpenAI, make: Factory) -> None:
    server.set_mode("slow", delay_s=10)
    error = fail(make(timeout_s=0.3))
    assert error.reason == "timeout"
    assert server.requests_count == 1


def test_a_refused_connection_is_an_embedding_failure(make: Factory) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port once the probe socket is closed.
    error = fail(make(base_url=f"http://127.0.0.1:{port}/v1"))
    assert error.code is ErrorCode.EMBEDDING_FAILED
    assert error.reason == "connection-failed"
    assert str(port) not in error.detail


def test_an_unreadable_api_key_fails_before_any_request(server: FakeOpenAI, make: Factory) -> None:
    def broken_key() -> str:
        raise OSError("secret store offline: sk-should-not-leak-0123456789")

    error = fail(make(api_key=broken_key))
    assert error.reason == "api-key-unavailable"
    assert "sk-should-not-leak" not in "".join(traceback.format_exception(error))
    assert server.requests_count == 0


# --- the API key never leaks -------------------------------------------------------------

WRONG_KEY = "sk-wrong-key-SECRET-9f8e7d6c5b4a3"


def _no_key_anywhere(error: RetrievalError, key: str) -> None:
    rendered = "".join(traceback.format_exception(error))
    for text in (str(error), repr(error), error.detail, rendered, str(error.reason)):
        assert key not in text
        assert key[-12:] not in text


def test_a_rejected_key_is_not_echoed_in_the_error(server: FakeOpenAI, make: Factory) -> None:
    error = fail(make(api_key=lambda: WRONG_KEY))
    # The server did receive the key and quoted it back in its message ...
    assert server.requests[0].headers["authorization"] == f"Bearer {WRONG_KEY}"
    assert error.reason == "http-error"
    assert "HTTP 401" in error.detail
    assert "Incorrect API key provided" in error.detail
    # ... which is scrubbed before it becomes a public detail.
    _no_key_anywhere(error, WRONG_KEY)


@pytest.mark.parametrize(
    "mode", ["server-error-echo-key", "server-error", "rate-limited", "slow", "drop-connection"]
)
def test_the_api_key_never_appears_in_a_raised_error(
    server: FakeOpenAI, make: Factory, mode: Mode
) -> None:
    server.set_mode(mode, delay_s=10)
    error = fail(make(timeout_s=0.3))
    _no_key_anywhere(error, DEFAULT_API_KEY)


def test_a_key_shaped_run_in_a_server_message_is_scrubbed(
    server: FakeOpenAI, make: Factory
) -> None:
    def leaky(_: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        return openai_error(
            500, "upstream rejected sk-proj-OTHERSECRET123456 and Bearer abc.def", type_="x"
        )

    server.route("POST", "/v1/embeddings", leaky)
    error = fail(make())
    assert "OTHERSECRET" not in error.detail
    assert "abc.def" not in error.detail
    assert "upstream rejected [redacted]" in error.detail


# --- send_dimensions ---------------------------------------------------------------------


def test_send_dimensions_false_omits_the_parameter_and_accepts_native_size(
    server: FakeOpenAI, make: Factory
) -> None:
    ada = descriptor(model="text-embedding-ada-002", dimensions=1536)
    batch = make(descriptor=ada, send_dimensions=False).embed(TEXTS, CancelToken())

    (request,) = server.requests
    assert "dimensions" not in request.json
    np.testing.assert_allclose(
        batch.vectors, expected(TEXTS, model="text-embedding-ada-002", dims=None), atol=1e-6
    )


def test_send_dimensions_false_still_checks_the_dimensions(
    server: FakeOpenAI, make: Factory
) -> None:
    # The model answers its native 1536 dimensions; the descriptor says 64.
    error = fail(make(send_dimensions=False))
    assert "dimensions" not in server.requests[0].json
    assert error.reason == "dimensions-mismatch"
    assert "1536" in error.detail


# --- batching, cancellation --------------------------------------------------------------


def test_batches_respect_the_input_limit(server: FakeOpenAI, make: Factory) -> None:
    texts = [f"passage {i}" for i in range(5)]
    batch = make(max_batch_inputs=2).embed(texts, CancelToken())

    assert [len(r.json["input"]) for r in server.requests] == [2, 2, 1]
    np.testing.assert_allclose(batch.vectors, expected(texts), atol=1e-6)
    assert batch.usage == EmbeddingUsage(
        requests=3, input_tokens=sum(fake_token_count(t) for t in texts)
    )


def test_batches_respect_the_token_limit_with_a_token_counter(
    server: FakeOpenAI, make: Factory
) -> None:
    counts = {"a": 4, "b": 4, "c": 4, "d": 20, "e": 1}
    adapter = make(max_batch_tokens=10, token_counter=lambda ts: [counts[t] for t in ts])
    batch = adapter.embed(list("abcde"), CancelToken())

    # An input over the batch budget on its own still goes, alone.
    assert [r.json["input"] for r in server.requests] == [["a", "b"], ["c"], ["d"], ["e"]]
    np.testing.assert_allclose(batch.vectors, expected(list("abcde")), atol=1e-6)


def test_batches_respect_the_token_limit_with_the_estimate(
    server: FakeOpenAI, make: Factory
) -> None:
    texts = ["x" * 18] * 4  # 18 bytes -> 10 estimated tokens each
    make(max_batch_tokens=25).embed(texts, CancelToken())
    assert [len(r.json["input"]) for r in server.requests] == [2, 2]


def test_a_failed_batch_raises_and_is_not_retried(server: FakeOpenAI, make: Factory) -> None:
    server.set_mode("server-error", after=1)
    error = fail(make(max_batch_inputs=1))
    assert error.reason == "http-error"
    # The first batch succeeded, the second failed; nothing was sent again or after it.
    assert server.requests_count == 2
    assert [r.json["input"] for r in server.requests] == [["alpha passage"], ["beta passage"]]


def test_a_cancelled_token_stops_before_the_first_request(
    server: FakeOpenAI, make: Factory
) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(RetrievalError) as info:
        make().embed(TEXTS, token)
    assert info.value.code is ErrorCode.CANCELLED
    assert server.requests_count == 0


class _CancelAfterProgress(CancelToken):
    """A real token that its owner cancels as soon as the first batch reports progress."""

    def __init__(self) -> None:
        super().__init__()
        self.progress_calls = 0

    def progress(self) -> None:
        super().progress()
        self.progress_calls += 1
        self.cancel()


def test_cancellation_is_checked_between_batches(server: FakeOpenAI, make: Factory) -> None:
    token = _CancelAfterProgress()
    with pytest.raises(RetrievalError) as info:
        make(max_batch_inputs=1).embed(TEXTS, token)
    assert info.value.code is ErrorCode.CANCELLED
    assert token.progress_calls == 1
    assert server.requests_count == 1


# --- token counting, configuration -------------------------------------------------------


def test_count_tokens_uses_the_counter_or_the_documented_estimate(make: Factory) -> None:
    assert make().count_tokens(["héllo", "", "東京"]) == [4, 1, 4]
    assert estimate_tokens(["abcd"]) == [3]
    assert make(token_counter=lambda ts: [len(t) for t in ts]).count_tokens(["abc"]) == [3]


def test_exposes_descriptor_and_input_limit(make: Factory) -> None:
    adapter = make(max_input_tokens=512)
    assert adapter.descriptor == descriptor()
    assert adapter.max_input_tokens == 512


@pytest.mark.parametrize(
    "overrides",
    [
        {"api_key": None},  # auth_mode api-key without a key
        {"descriptor": descriptor(auth_mode="none")},  # a key with auth_mode none
        {"descriptor": descriptor(auth_mode="local")},
        {"base_url": "http://user:pw@127.0.0.1:1/v1"},
        {"base_url": "ftp://127.0.0.1/v1"},
        {"base_url": "http://[::1/v1"},
        {"verify": "/nonexistent/ca.pem"},
        {"max_batch_inputs": 0},
        {"timeout_s": 0},
    ],
)
def test_rejects_an_inconsistent_configuration(make: Factory, overrides: dict[str, object]) -> None:
    with pytest.raises(RetrievalError) as info:
        make(**overrides)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.reason == "embedding-config"


def test_the_fake_records_what_it_answers(server: FakeOpenAI, make: Factory) -> None:
    # Guards the fake itself: a bad mode only ever affects the requests after `after`.
    server.set_mode("wrong-model", after=1)
    adapter = make()
    adapter.embed(["one"], CancelToken())
    assert fail(adapter, ["two"]).reason == "model-mismatch"
    server.reset()
    adapter.embed(["three"], CancelToken())
    assert json.loads(server.requests[0].body)["input"] == ["three"]


# --- through RetrievalService with the real SQLite store --------------------------------------

CORPUS = "handbook"
NAMESPACE = "tenant-a"
CHUNKS = [ChunkInput(f"doc-1#{i}", text, Location(page=i + 1)) for i, text in enumerate(TEXTS)]
INDEX = IndexRequest(CORPUS, SourceInfo("doc-1", "r1", "Handbook"), CHUNKS)


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    if request.operation == "index":
        return Grant(NAMESPACE, {"doc-1": ANY_REVISION})
    return Grant(NAMESPACE, {"doc-1": "r1"})


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store" / "corpora.db"


@contextlib.contextmanager
def opened(db_path: Path, adapter: OpenAIEmbedding) -> Iterator[RetrievalService]:
    # Passages embedded as given (no passage context) and no query cache: these tests compare
    # the fake's vectors, token counts and request counts with the texts themselves.
    with SqliteVectorStore.open(db_path) as store:
        corpus = Corpus(
            CORPUS, "passages-v1", adapter, store, authorize, chunking={"context": "none"}
        )
        yield RetrievalService([corpus], query_cache_entries=0)


def test_an_identical_reindex_is_unchanged_without_any_embedding_request(
    server: FakeOpenAI, make: Factory, db_path: Path
) -> None:
    context = RequestContext("alice")
    with opened(db_path, make()) as service:
        first = service.index_context(INDEX, context)
        assert (first.status, server.requests_count) == ("indexed", 1)
        again = service.index_context(INDEX, context)
    assert again.status == "unchanged"
    assert again.usage == EmbeddingUsage()
    assert server.requests_count == 1

    # Also after the corpus is reopened by a new service on the same file.
    with opened(db_path, make()) as service:
        reopened = service.index_context(INDEX, context)
    assert reopened.status == "unchanged"
    assert server.requests_count == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "text-embedding-3-large"}, "embedding.model"),
        ({"dimensions": 32}, "embedding.dimensions"),
        ({"account_id": "other-account"}, "embedding.account_id"),
    ],
)
def test_reopening_with_another_descriptor_fails_before_any_embedding_request(
    server: FakeOpenAI, make: Factory, db_path: Path, change: dict[str, object], field: str
) -> None:
    with opened(db_path, make()) as service:
        service.index_context(INDEX, RequestContext("alice"))
    server.reset()

    with (
        pytest.raises(RetrievalError) as info,
        opened(db_path, make(descriptor=descriptor(**change))),
    ):
        pass
    assert info.value.code is ErrorCode.DESCRIPTOR_MISMATCH
    assert field in info.value.detail
    assert server.requests_count == 0


def test_reopening_with_the_same_descriptor_searches_the_stored_vectors(
    server: FakeOpenAI, make: Factory, db_path: Path
) -> None:
    with opened(db_path, make()) as service:
        service.index_context(INDEX, RequestContext("alice"))
    server.reset()

    with opened(db_path, make()) as service:
        result = service.search_context(
            SearchRequest(CORPUS, "beta passage"), RequestContext("bob")
        )
    # The fake embeds equal texts equally: the passage with the query's text scores 1.
    assert result.hits[0].chunk_id == "doc-1#1"
    assert result.hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert server.requests_count == 1


def test_embedding_usage_is_reported_on_index_and_search_results(
    server: FakeOpenAI, make: Factory, db_path: Path
) -> None:
    context = RequestContext("alice")
    with opened(db_path, make(max_batch_inputs=2)) as service:
        indexed = service.index_context(INDEX, context)
        found = service.search_context(SearchRequest(CORPUS, "gamma"), context)

    assert indexed.usage == EmbeddingUsage(
        requests=2, input_tokens=sum(fake_token_count(t) for t in TEXTS)
    )
    assert found.usage == EmbeddingUsage(requests=1, input_tokens=fake_token_count("gamma"))
    assert server.requests_count == 3


def test_a_failed_embedding_stores_nothing_and_is_not_retried(
    server: FakeOpenAI, make: Factory, db_path: Path
) -> None:
    server.set_mode("server-error", after=1)
    context = RequestContext("alice")
    with opened(db_path, make(max_batch_inputs=1)) as service:
        with pytest.raises(RetrievalError) as info:
            service.index_context(INDEX, context)
        assert info.value.code is ErrorCode.EMBEDDING_FAILED
        assert server.requests_count == 2
        # The first batch's vectors were discarded: the source is not indexed at all.
        assert service.corpus(CORPUS).store.get_source(CORPUS, NAMESPACE, "doc-1") is None

        server.reset()
        assert service.index_context(INDEX, context).status == "indexed"
    assert server.requests_count == 3

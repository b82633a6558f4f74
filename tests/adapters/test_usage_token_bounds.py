"""A token count no usage record can hold (beyond 2**63 - 1) is never taken as reported usage:
a reranker's `total_tokens: 2**70` was echoed by the search and dropped the usage records
committed with it (probe H, session 40). Each adapter treats it as it treats other malformed
usage: the reranker as not reported, the embedding and chat adapters as a malformed answer."""

from __future__ import annotations

from typing import Any

import pytest

from retrieval_host.adapters.embedding_openai import OpenAIEmbedding
from retrieval_host.adapters.provider_openai import OpenAIChatProvider
from retrieval_host.adapters.rerank_http import HttpReranker
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import EmbeddingDescriptor, RerankDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.reasons import EmbeddingFailedReason, ProviderFailedReason
from retrieval_host.core.run_ports import GenerationRequest, Message, UsageReported
from retrieval_host.core.runs_model import GenerationUsage
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    FakeOpenAI,
    PlannedResponse,
    RecordedRequest,
    Reply,
    fake_vector,
    json_reply,
)
from tests.support.fake_rerank import RERANK_MODEL, RERANK_PATH

HUGE = 2**70
MAX_REPORTED_TOKENS = 2**63 - 1  # what a usage record's 64-bit column holds


def _reporting(usage: dict[str, Any]) -> Any:
    """A /rerank route that ranks the documents in order and reports `usage`."""

    def handle(_: FakeOpenAI, request: RecordedRequest, __: int) -> Reply:
        documents = request.json["documents"]
        results = [{"index": i, "relevance_score": 1.0 - i / 10} for i in range(len(documents))]
        return json_reply(200, {"results": results, "usage": usage})

    return handle


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        ({"total_tokens": HUGE}, 0),
        ({"total_tokens": HUGE, "prompt_tokens": 12}, 12),
        ({"total_tokens": MAX_REPORTED_TOKENS}, MAX_REPORTED_TOKENS),
    ],
)
def test_a_reranker_count_beyond_a_usage_record_is_not_reported_usage(
    server: FakeOpenAI, usage: dict[str, Any], tokens: int
) -> None:
    server.route("POST", RERANK_PATH, _reporting(usage))
    descriptor = RerankDescriptor("rerank-http", "test", "acct", "api-key", RERANK_MODEL)
    with HttpReranker(
        descriptor=descriptor, base_url=server.base_url, api_key=lambda: DEFAULT_API_KEY
    ) as reranker:
        batch = reranker.rerank("q", ["a", "b"], 2, CancelToken())
    assert [s.index for s in batch.results] == [0, 1]  # the answer itself is used
    assert batch.usage.input_tokens == tokens


@pytest.mark.parametrize(("prompt", "fails"), [(HUGE, True), (MAX_REPORTED_TOKENS, False)])
def test_an_embedding_count_beyond_a_usage_record_is_a_malformed_answer(
    server: FakeOpenAI, prompt: int, fails: bool
) -> None:
    def handle(_: FakeOpenAI, request: RecordedRequest, __: int) -> Reply:
        inputs = request.json["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector("m", t, 8, None)}
            for i, t in enumerate(inputs)
        ]
        usage = {"prompt_tokens": prompt, "total_tokens": prompt}
        return json_reply(200, {"object": "list", "data": data, "model": "m", "usage": usage})

    server.route("POST", "/v1/embeddings", handle)
    descriptor = EmbeddingDescriptor("openai-main", "openai", "acct", "api-key", "m", 8)
    adapter = OpenAIEmbedding(
        descriptor=descriptor, base_url=server.base_url, api_key=lambda: DEFAULT_API_KEY
    )
    try:
        if not fails:
            usage = adapter.embed(["one"], CancelToken()).usage
            assert usage == EmbeddingUsage(requests=1, input_tokens=MAX_REPORTED_TOKENS)
            return
        with pytest.raises(RetrievalError) as caught:
            adapter.embed(["one"], CancelToken())
    finally:
        adapter.close()
    assert caught.value.code is ErrorCode.EMBEDDING_FAILED
    assert caught.value.reason == EmbeddingFailedReason.MALFORMED_RESPONSE


@pytest.mark.parametrize(
    ("usage", "fails"),
    [((HUGE, 1), True), ((1, HUGE), True), ((MAX_REPORTED_TOKENS, 1), False)],
)
def test_a_chat_count_beyond_a_usage_record_is_a_malformed_answer(
    server: FakeOpenAI, usage: tuple[int, int], fails: bool
) -> None:
    server.script_chat([PlannedResponse(text="An answer.", usage=usage)])
    request = GenerationRequest(model="gpt-4o-mini", messages=[Message("user", "Question?")])
    with OpenAIChatProvider(base_url=server.base_url, api_key=lambda: DEFAULT_API_KEY) as chat:
        if not fails:
            events = list(chat.generate(request, CancelToken()))
            assert events[-1] == UsageReported(
                GenerationUsage(input_tokens=MAX_REPORTED_TOKENS, output_tokens=1)
            )
            return
        with pytest.raises(RetrievalError) as caught:
            list(chat.generate(request, CancelToken()))
    assert caught.value.code is ErrorCode.PROVIDER_FAILED
    assert caught.value.reason == ProviderFailedReason.MALFORMED_CHUNK

"""Reranking over the widely served `/rerank` HTTP format (`POST {base_url}/rerank`).

The request is `{model, query, documents, top_n}` with `documents` as plain strings and
`return_documents: false`; the answer is `{results: [{index, relevance_score}, ...]}` in any
order, as Cohere-, Jina-, vLLM- and TEI-style endpoints serve it (TEI's `/rerank` answers a
bare list of the same items, also accepted). Usage is read when reported (`usage.total_tokens`
or `usage.prompt_tokens`, as Jina and vLLM do; Cohere's `meta.billed_units` is not a token
count and is not read).

Shapes are checked here (a list of objects, an integer index, a JSON number); the semantic
checks every reranker gets (one result per document, no index twice or out of range, finite
scores) are `core.rerank.check_scores`. Any failure raises `RERANK_FAILED` with its reason;
nothing is retried, not even a call whose kept-alive connection fails before the answer (the
service may have scored, and billed, it). Connections are kept alive for up to 1 s idle. The API
key is read from a callable for each request, sent only in the `Authorization` header and
scrubbed from error details, and proxies and redirects are not followed (see `_openai_http`).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Final

import httpx

from retrieval_host.adapters._openai_http import (
    ClientLanes,
    encode_json,
    endpoint_url,
    error_message,
    post_capped,
    read_api_key,
    request_headers,
    scrub,
    tls_verify,
    token_count,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import RerankDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import RerankUsage
from retrieval_host.core.ports import RerankBatch, RerankScore
from retrieval_host.core.reasons import InvalidRequestReason, RerankFailedReason

__all__ = ["HttpReranker"]

_USER_AGENT: Final = "retrieval-host (rerank-http)"
# An item is `{"index": N, "relevance_score": X}` plus what a server adds (an id, a document
# echo it was asked not to send); 64 KiB per document and 1 MiB besides bound any honest answer.
_BYTES_PER_RESULT: Final = 64 * 1024
_RESPONSE_OVERHEAD_BYTES: Final = 1024 * 1024


def _fail(detail: str, reason: RerankFailedReason) -> RetrievalError:
    return RetrievalError(ErrorCode.RERANK_FAILED, detail, reason=reason)


def _key_unavailable(detail: str) -> RetrievalError:
    return _fail(detail, RerankFailedReason.API_KEY_UNAVAILABLE)


def _config_error(detail: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST, detail, reason=InvalidRequestReason.RERANK_CONFIG
    )


def _malformed(detail: str) -> RetrievalError:
    return _fail(detail, RerankFailedReason.MALFORMED_RESPONSE)


class HttpReranker:
    """A `/rerank` endpoint (implements `core.ports.Reranker`).

    - `descriptor.model` is sent as `model`; the descriptor is pinned in the corpus.
    - `api_key`: called for each request; None sends no `Authorization` header and requires
      `descriptor.auth_mode == "none"`.
    - `timeout_s` applies to each phase (connect, write, each read, pool), as httpx defines it,
      and bounds the body: a body still arriving `timeout_s` after the request was sent fails
      (`timeout`), and the search's cancel token is checked as it arrives (headers sent
      slower than a byte per `timeout_s` are bounded per read only).
    - `verify`: True (system CAs), False, a CA bundle path, or an `ssl.SSLContext`.
    - `max_documents`: documents per call; a search sends the larger of its corpus's
      `RerankSettings.candidates` and its limit + 1, so a larger call is a configuration
      error.
    """

    def __init__(
        self,
        *,
        descriptor: RerankDescriptor,
        base_url: str,
        api_key: Callable[[], str] | None,
        timeout_s: float = 30.0,
        verify: str | bool | ssl.SSLContext = True,
        max_documents: int = 1000,
    ) -> None:
        if (api_key is None) != (descriptor.auth_mode == "none"):
            raise _config_error("auth_mode 'api-key' needs an api_key; 'none' must have none.")
        if not timeout_s > 0:
            raise _config_error("timeout_s must be positive.")
        if max_documents < 1:
            raise _config_error("max_documents must be positive.")
        self._descriptor = descriptor
        self._url = endpoint_url(base_url, "/rerank", _config_error)
        self._api_key = api_key
        self._max_documents = max_documents
        self._timeout_s = timeout_s
        # Each call on a lane's connection (kept alive up to 1 s idle), which `post_capped`
        # shuts down when the search is cancelled while the service computes (it waited out the
        # answer).
        self._lanes = ClientLanes(
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify, _config_error),
            headers={"Accept": "application/json", "User-Agent": _USER_AGENT},
        )

    @property
    def descriptor(self) -> RerankDescriptor:
        return self._descriptor

    def rerank(
        self, query: str, documents: Sequence[str], top_n: int, cancel: CancelToken
    ) -> RerankBatch:
        """One call scoring `documents` against `query`; the results as the service gave them."""
        if not documents:
            return RerankBatch([], RerankUsage())
        if len(documents) > self._max_documents:
            raise _config_error(
                f"at most {self._max_documents} documents per rerank call; "
                f"lower the corpus's rerank candidates."
            )
        cancel.check()
        key = read_api_key(self._api_key, "rerank", _key_unavailable)
        content = encode_json(
            {
                "model": self._descriptor.model,
                "query": query,
                "documents": list(documents),
                "top_n": top_n,
                "return_documents": False,
            }
        )
        limit = _RESPONSE_OVERHEAD_BYTES + len(documents) * _BYTES_PER_RESULT
        status, raw = post_capped(
            self._lanes,
            self._url,
            content=content,
            headers=request_headers(key),
            limit=limit,
            too_large=lambda: _malformed("the rerank response is too large."),
            timed_out=lambda: _fail(
                "the rerank service did not answer in time.", RerankFailedReason.TIMEOUT
            ),
            unreachable=lambda name: _fail(
                f"could not reach the rerank service ({name}).",
                RerankFailedReason.CONNECTION_FAILED,
            ),
            total_s=self._timeout_s,
            cancel=cancel,
        )
        if status != 200:
            raise _status_error(status, raw, key)
        results, tokens = _parse(raw)
        return RerankBatch(results, RerankUsage(1, len(documents), tokens))

    def close(self) -> None:
        """Close the kept-alive connections. The adapter cannot be used afterwards."""
        self._lanes.close()

    def __enter__(self) -> HttpReranker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _status_error(status: int, raw: bytes, key: str | None) -> RetrievalError:
    message = scrub(error_message(raw) or _detail_message(raw), key)
    suffix = f": {message}" if message else "."
    if status == 429:
        return _fail(
            f"the rerank service is rate limiting (HTTP 429){suffix}",
            RerankFailedReason.RATE_LIMITED,
        )
    return _fail(
        f"the rerank service answered HTTP {status}{suffix}", RerankFailedReason.HTTP_ERROR
    )


def _detail_message(raw: bytes) -> str:
    """`message` or `detail` at the top of a JSON error body (Cohere, Jina, vLLM), or ''."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(doc, dict):
        return ""
    for name in ("message", "detail", "error"):
        value = doc.get(name)
        if isinstance(value, str):
            return value[:2000]
    return ""


def _parse(raw: bytes) -> tuple[list[RerankScore], int]:
    try:
        doc: Any = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _malformed("the rerank response is not JSON.") from None
    items = doc.get("results") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise _malformed("the rerank response has no list of results.")
    results: list[RerankScore] = []
    for item in items:
        if not isinstance(item, dict):
            raise _malformed("a rerank result is not an object.")
        index = item.get("index")
        # bool is an int subclass: `true` is not an index.
        if type(index) is not int:
            raise _malformed("a rerank result has no integer index.")
        score = item.get("relevance_score", item.get("score"))
        if type(score) is not float and type(score) is not int:
            raise _malformed("a rerank result has no numeric relevance_score.")
        try:
            value = float(score)
        except OverflowError:  # an integer literal beyond any float
            value = float("inf")
        results.append(RerankScore(index, value))
    usage = doc.get("usage") if isinstance(doc, dict) else None
    return results, _tokens(usage)


def _tokens(usage: object) -> int:
    """Tokens the service reports using (`total_tokens`, else `prompt_tokens`); 0 if none."""
    if not isinstance(usage, dict):
        return 0
    for name in ("total_tokens", "prompt_tokens"):
        # A count no usage record can hold is not reported, like a negative one.
        tokens = token_count(usage.get(name))
        if tokens is not None:
            return tokens
    return 0

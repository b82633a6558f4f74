"""The `/rerank` wire format on a real loopback HTTP server (`FakeOpenAI`'s), misbehaving on
demand.

`POST /v1/rerank` takes `{model, query, documents, top_n}` and answers, as Cohere and Jina do,
`{"results": [{"index": i, "relevance_score": s}, ...], "usage": {"total_tokens": n}}`, best
first and `top_n` long. The score of a document is the share of the query's words it contains
(lower-cased runs of letters and digits), so a test can predict the order; `score_of` replaces
that rule. Every request body is recorded (`requests`).

    with FakeOpenAI() as server:
        fake = FakeReranker(server)
        fake.base_url                      # what `HttpReranker(base_url=...)` takes
        fake.set_mode("duplicate-index")   # every later request answers with that defect
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal

from tests.support.fake_openai import FakeOpenAI, RecordedRequest, Reply, json_reply, openai_error

RERANK_PATH: Final = "/v1/rerank"
RERANK_MODEL: Final = "rerank-english-v3.0"
_WORD = re.compile(r"[a-z0-9]+")

RerankMode = Literal[
    "ok",
    "tei-list",  # a bare list of {index, score}, as TEI's /rerank answers
    "ascending",  # the right results, worst first
    "too-few",  # the last result dropped
    "too-many",  # one result repeated for an index past the documents
    "duplicate-index",  # the first index twice, in place of the second result
    "out-of-range",  # the last index replaced by len(documents)
    "negative-index",  # the last index replaced by -1
    "nan",  # NaN as the first score (Python's JSON writes the non-standard literal)
    "infinity",  # Infinity as the first score
    "huge-integer",  # an integer score beyond any float
    "string-score",  # the first score as a string
    "bool-index",  # `index: true` in the first result
    "no-results",  # an object without `results`
    "malformed-json",  # 200 with a truncated JSON body
    "server-error",  # 500 with an error body
    "server-error-echo-key",  # 500 whose message echoes the bearer key it was sent
    "rate-limited",  # 429
    "slow",  # waits `delay_s` before answering normally
    "drip",  # a right answer, padded, one byte every `delay_s` (never a read timeout)
    "drop-connection",  # closes the socket without answering
]


def overlap_score(query: str, document: str) -> float:
    """The share of the query's words found in the document (0..1)."""
    wanted = set(_WORD.findall(query.lower()))
    if not wanted:
        return 0.0
    return len(wanted & set(_WORD.findall(document.lower()))) / len(wanted)


class FakeReranker:
    """A `/rerank` route on `server` (it must be running for `base_url`)."""

    def __init__(
        self,
        server: FakeOpenAI,
        *,
        model: str = RERANK_MODEL,
        score_of: Callable[[str, str], float] = overlap_score,
    ) -> None:
        self._server = server
        self.model = model
        self.score_of = score_of
        self._lock = threading.Lock()
        self._mode: RerankMode = "ok"
        self._delay_s = 5.0
        self._bodies: list[Any] = []
        # Adapters a test made for this fake (anything with `close`), closed by `close_adapters`.
        self.adapters: list[Any] = []
        server.route("POST", RERANK_PATH, self._handle)

    def close_adapters(self) -> None:
        for adapter in self.adapters:
            adapter.close()
        self.adapters.clear()

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def set_mode(self, mode: RerankMode, *, delay_s: float = 5.0) -> None:
        with self._lock:
            self._mode = mode
            self._delay_s = delay_s

    @property
    def requests(self) -> list[Any]:
        """The JSON body of every rerank request received, in order."""
        with self._lock:
            return list(self._bodies)

    def reset(self) -> None:
        with self._lock:
            self._bodies.clear()
            self._mode = "ok"

    def _handle(self, server: FakeOpenAI, request: RecordedRequest, _: int) -> Reply:
        with self._lock:
            self._bodies.append(request.json)
            mode, delay_s = self._mode, self._delay_s
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("documents"), list):
            return openai_error(400, "documents must be a list", type_="invalid_request_error")
        if body.get("model") != self.model:
            return openai_error(404, "model not found", type_="invalid_request_error")
        query = str(body.get("query", ""))
        documents: Sequence[str] = [str(d) for d in body["documents"]]
        top_n = body.get("top_n", len(documents))
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        if mode == "drop-connection":
            return Reply(drop=True)
        if mode == "server-error":
            return openai_error(500, "The reranker had an internal error.", type_="server_error")
        if mode == "server-error-echo-key":
            return openai_error(500, f"Internal error for key {bearer}", type_="server_error")
        if mode == "rate-limited":
            return openai_error(429, "Rate limit reached.", type_="rate_limit_error")
        if mode == "malformed-json":
            return Reply(200, b'{"results": [{"index": 0, "relevance')
        if mode == "slow":
            server.wait(delay_s)
        scored = sorted(
            ((i, self.score_of(query, d)) for i, d in enumerate(documents)),
            key=lambda pair: (-pair[1], pair[0]),
        )[:top_n]
        results: list[dict[str, Any]] = [{"index": i, "relevance_score": s} for i, s in scored]
        tokens = sum(len(_WORD.findall(d)) for d in documents) + len(_WORD.findall(query))
        if mode == "tei-list":
            return json_reply(
                200, [{"index": r["index"], "score": r["relevance_score"]} for r in results]
            )
        _misbehave(mode, results, len(documents))
        if mode == "no-results":
            return json_reply(200, {"id": "rr-1", "data": results})
        raw = json.dumps({"id": "rr-1", "results": results, "usage": {"total_tokens": tokens}})
        if mode == "drip":
            return Reply(200, stream=_drip(server, raw.encode("utf-8") + b" " * 4096, delay_s))
        return Reply(200, raw.encode("utf-8"))


def _drip(server: FakeOpenAI, body: bytes, delay_s: float) -> Iterator[bytes]:
    """`body` a byte at a time, `delay_s` apart (the pace of the service, not a test's wait)."""
    for i in range(len(body)):
        yield body[i : i + 1]
        server.wait(delay_s)


def _misbehave(mode: RerankMode, results: list[dict[str, Any]], n: int) -> None:
    """Apply a result-level defect in place."""
    if mode == "ascending":
        results.reverse()
    elif mode == "too-few":
        results.pop()
    elif mode == "too-many":
        results.append({"index": n, "relevance_score": 0.0})
    elif mode == "duplicate-index" and len(results) > 1:
        results[1] = {**results[1], "index": results[0]["index"]}
    elif mode == "out-of-range":
        results[-1] = {**results[-1], "index": n}
    elif mode == "negative-index":
        results[-1] = {**results[-1], "index": -1}
    elif mode == "nan":
        results[0] = {**results[0], "relevance_score": float("nan")}
    elif mode == "infinity":
        results[0] = {**results[0], "relevance_score": float("inf")}
    elif mode == "huge-integer":
        results[0] = {**results[0], "relevance_score": 10**400}
    elif mode == "string-score":
        results[0] = {**results[0], "relevance_score": str(results[0]["relevance_score"])}
    elif mode == "bool-index":
        results[0] = {**results[0], "index": True}

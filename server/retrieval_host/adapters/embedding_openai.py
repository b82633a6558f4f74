"""OpenAI-compatible embeddings over HTTPS (`POST {base_url}/embeddings`), validated strictly.

Everything the server returns is checked before a vector reaches a store: the model name (an
exact match: a dated or suffixed name such as `text-embedding-3-small-2024-01-25` is a different
model and is refused, because vectors of two model builds are not comparable), the dimensions
(checked even when the `dimensions` parameter is not sent), one item per input by `index` (no
duplicates, gaps or extras), plain JSON numbers, finite and not all zero. Any failure raises
`EMBEDDING_FAILED` with a distinct `reason`, and nothing is retried: retrying is
the caller's decision, and an identical index request then confirms `unchanged`.

The API key is read from a callable at each request, sent only in the `Authorization` header, and
scrubbed from every error detail (some servers echo the key they were given).

Cancellation and the caller's inactivity timeout are honoured while the service computes: a
service answers a batch only once it is embedded, so checks between body chunks alone left a
cancelled index waiting out the whole call (cancel at 0.5 s, returned after 6 s: a black-box
probe). `post_capped`'s `SocketWatchdog` shuts the call's socket down once the token is
cancelled or idle, and the token's own error (`CANCELLED`, `TIMEOUT`/`idle-timeout`) is
raised. A batch counts as progress only once it has arrived within the inactivity timeout.
Connections are kept alive for up to 1 s idle: each call borrows a `ClientLanes` lane, a client
of one connection whose socket the watchdog knows. A call is sent once, never twice: a connection
that fails before the answer fails the call (`connection-failed`), because the service may have
embedded, and billed, the batch it read.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import httpx
import numpy as np
import numpy.typing as npt

from retrieval_host.adapters._openai_http import (
    MAX_ERROR_MESSAGE_CHARS,
    ClientLanes,
    encode_json,
    endpoint_url,
    error_message,
    error_param,
    post_capped,
    read_api_key,
    request_headers,
    scrub,
    tls_verify,
    token_count,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.descriptor import EmbeddingDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import EmbeddingUsage
from retrieval_host.core.ports import EmbeddingBatch
from retrieval_host.core.reasons import EmbeddingFailedReason, InvalidRequestReason

TokenCounter = Callable[[Sequence[str]], list[int]]

__all__ = ["MAX_ERROR_MESSAGE_CHARS", "OpenAIEmbedding", "TokenCounter", "estimate_tokens"]

# A JSON float with 17 significant digits, sign, exponent and separator stays under 32 bytes;
# anything far larger than that for the batch is not an embeddings response.
_BYTES_PER_VALUE: Final = 32
_RESPONSE_OVERHEAD_BYTES: Final = 1024 * 1024
_USER_AGENT: Final = "retrieval-host (embedding-openai)"


def estimate_tokens(texts: Sequence[str]) -> list[int]:
    """A tokenizer-free upper estimate: UTF-8 bytes // 2 + 1 per text.

    BPE tokenizers of embedding models average about four bytes of English per token, so this
    overestimates typical text about twofold, which keeps batches under a server's token limit
    without a tokenizer. It is a heuristic, not a bound: text made of rare characters (emoji,
    uncommon CJK, random bytes) can take a token per byte. Pass the model's own tokenizer as
    `token_counter` when limits must be exact.
    """
    return [len(t.encode("utf-8", "surrogatepass")) // 2 + 1 for t in texts]


def _key_unavailable(detail: str) -> RetrievalError:
    return _fail(detail, EmbeddingFailedReason.API_KEY_UNAVAILABLE)


def _fail(detail: str, reason: EmbeddingFailedReason) -> RetrievalError:
    return RetrievalError(ErrorCode.EMBEDDING_FAILED, detail, reason=reason)


class OpenAIEmbedding:
    """The OpenAI-compatible embedding adapter (implements `core.ports.EmbeddingAdapter`).

    - `descriptor`: the corpus identity; `descriptor.model` is sent as `model` and must come back
      unchanged, `descriptor.dimensions` is sent as `dimensions` (unless `send_dimensions` is
      False, for models that reject the parameter) and is always checked.
    - `api_key`: called for each request; None sends no `Authorization` header and requires
      `descriptor.auth_mode == "none"`.
    - Batches hold at most `max_batch_inputs` texts and `max_batch_tokens` counted tokens (a
      single longer text goes alone). Tokens are counted by `token_counter` when given, else by
      `estimate_tokens`.
    - Usage: one request per HTTP call; input tokens from the response's `usage.prompt_tokens`,
      counted as 0 for a response that reports no usage (the value is informative, never
      guessed).
    - `timeout_s` applies to each phase (connect, write, each read, pool), as httpx defines it,
      and bounds each request's whole answer: a body still arriving `timeout_s` after the
      request was sent fails (`timeout`), so a request ends within about twice `timeout_s`.
    - `embed`'s `CancelToken` stops a request as soon as it is cancelled or its inactivity
      timeout runs out (see the module doc); no request is sent after that.
    - `verify`: True (system CAs), False, a CA bundle path, or an `ssl.SSLContext`. Proxy
      environment variables and `.netrc` are ignored: nothing here reads the environment.
    """

    def __init__(
        self,
        *,
        descriptor: EmbeddingDescriptor,
        base_url: str,
        api_key: Callable[[], str] | None,
        send_dimensions: bool = True,
        max_batch_inputs: int = 256,
        max_batch_tokens: int = 8000,
        max_input_tokens: int = 8191,
        timeout_s: float = 60.0,
        verify: str | bool | ssl.SSLContext = True,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if descriptor.auth_mode == "local":
            raise _config_error("a hosted embedding cannot use auth_mode 'local'.")
        if (api_key is None) != (descriptor.auth_mode == "none"):
            raise _config_error("auth_mode 'api-key' needs an api_key; 'none' must have none.")
        if min(max_batch_inputs, max_batch_tokens, max_input_tokens) < 1:
            raise _config_error("batch and input limits must be positive.")
        if not timeout_s > 0:
            raise _config_error("timeout_s must be positive.")
        url = endpoint_url(base_url, "/embeddings", _config_error)
        self._descriptor = descriptor
        self._url = url
        self._api_key = api_key
        self._send_dimensions = send_dimensions
        self._max_batch_inputs = max_batch_inputs
        self._max_batch_tokens = max_batch_tokens
        self._max_input_tokens = max_input_tokens
        self._count: TokenCounter = token_counter or estimate_tokens
        self._timeout_s = timeout_s
        self._lanes = ClientLanes(
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify, _config_error),
            headers={"Accept": "application/json", "User-Agent": _USER_AGENT},
        )

    @property
    def descriptor(self) -> EmbeddingDescriptor:
        return self._descriptor

    @property
    def max_input_tokens(self) -> int:
        return self._max_input_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts by `token_counter`, or the documented estimate without one."""
        counts = list(self._count(texts))
        if len(counts) != len(texts):
            raise _fail(
                "the token counter returned the wrong number of counts.",
                EmbeddingFailedReason.TOKEN_COUNTER,
            )
        return counts

    def embed(self, texts: Sequence[str], cancel: CancelToken) -> EmbeddingBatch:
        """Embed `texts` in order; unit-normalised float32 rows. Raises on the first bad batch."""
        dims = self._descriptor.dimensions
        out = np.empty((len(texts), dims), dtype=np.float32)
        usage = EmbeddingUsage()
        for start, stop in self._batches(texts):
            cancel.check()
            vectors, tokens = self._embed_batch(texts[start:stop], cancel)
            # A batch that took longer than the inactivity timeout is not progress: checked
            # before `progress()`, which would otherwise reset the clock it overran.
            cancel.check()
            out[start:stop] = vectors
            usage += EmbeddingUsage(requests=1, input_tokens=tokens)
            cancel.progress()
        return EmbeddingBatch(out, usage)

    def close(self) -> None:
        """Close the kept-alive connections. The adapter cannot be used afterwards."""
        self._lanes.close()

    def __enter__(self) -> OpenAIEmbedding:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- batching --------------------------------------------------------------------------

    def _batches(self, texts: Sequence[str]) -> Iterator[tuple[int, int]]:
        """Consecutive [start, stop) ranges within the input and token limits."""
        if not texts:
            return
        counts = self.count_tokens(texts)
        start, tokens = 0, 0
        for i, n in enumerate(counts):
            full = i - start >= self._max_batch_inputs or tokens + n > self._max_batch_tokens
            if i > start and full:
                yield start, i
                start, tokens = i, 0
            tokens += n
        yield start, len(texts)

    # --- one HTTP call ---------------------------------------------------------------------

    def _embed_batch(
        self, texts: Sequence[str], cancel: CancelToken
    ) -> tuple[npt.NDArray[np.float32], int]:
        body: dict[str, Any] = {
            "model": self._descriptor.model,
            "input": list(texts),
            "encoding_format": "float",
        }
        if self._send_dimensions:
            body["dimensions"] = self._descriptor.dimensions
        key = read_api_key(self._api_key, "embedding", _key_unavailable)
        headers = request_headers(key)
        content = encode_json(body)
        limit = (
            _RESPONSE_OVERHEAD_BYTES + len(texts) * self._descriptor.dimensions * _BYTES_PER_VALUE
        )
        status, raw = post_capped(
            self._lanes,
            self._url,
            content=content,
            headers=headers,
            limit=limit,
            too_large=_too_large,
            timed_out=lambda: _fail(
                "the embedding service did not answer in time.", EmbeddingFailedReason.TIMEOUT
            ),
            unreachable=lambda name: _fail(
                f"could not reach the embedding service ({name}).",
                EmbeddingFailedReason.CONNECTION_FAILED,
            ),
            total_s=self._timeout_s,
            cancel=cancel,
        )
        if status != 200:
            raise self._status_error(status, raw, key)
        return self._parse(raw, len(texts), key)

    def _status_error(self, status: int, raw: bytes, key: str | None) -> RetrievalError:
        message = scrub(error_message(raw), key)
        suffix = f": {message}" if message else "."
        if status == 429:
            return _fail(
                f"the embedding service is rate limiting (HTTP 429){suffix}",
                EmbeddingFailedReason.RATE_LIMITED,
            )
        if status == 400 and self._send_dimensions and error_param(raw) == "dimensions":
            return _fail(
                f"the embedding model rejected the dimensions parameter (HTTP 400){suffix} "
                "Configure send_dimensions=False for this model.",
                EmbeddingFailedReason.DIMENSIONS_UNSUPPORTED,
            )
        return _fail(
            f"the embedding service answered HTTP {status}{suffix}",
            EmbeddingFailedReason.HTTP_ERROR,
        )

    def _parse(self, raw: bytes, n: int, key: str | None) -> tuple[npt.NDArray[np.float32], int]:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise _fail(
                "the embedding response is not JSON.", EmbeddingFailedReason.MALFORMED_RESPONSE
            ) from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise _fail(
                "the embedding response has no list of embeddings.",
                EmbeddingFailedReason.MALFORMED_RESPONSE,
            )
        model = doc.get("model")
        if model != self._descriptor.model:
            shown = repr(scrub(model[:80], key)) if isinstance(model, str) else "no model"
            raise _fail(
                f"the embedding service answered with {shown}, "
                f"not the configured model {self._descriptor.model!r}.",
                EmbeddingFailedReason.MODEL_MISMATCH,
            )
        tokens = _prompt_tokens(doc.get("usage"))

        dims = self._descriptor.dimensions
        rows: list[list[float] | None] = [None] * n
        for item in data:
            index = item.get("index")
            if type(index) is not int:
                raise _fail(
                    "an embedding item has no integer index.",
                    EmbeddingFailedReason.MALFORMED_RESPONSE,
                )
            if not 0 <= index < n:
                raise _fail(
                    f"the embedding service returned index {index} for {n} inputs.",
                    EmbeddingFailedReason.EXTRA_INDEX,
                )
            if rows[index] is not None:
                raise _fail(
                    f"the embedding service returned index {index} twice.",
                    EmbeddingFailedReason.DUPLICATE_INDEX,
                )
            vector = item.get("embedding")
            if not isinstance(vector, list):
                raise _fail(
                    "an embedding is not a list of floats.", EmbeddingFailedReason.NON_FLOAT_VALUE
                )
            # bool is an int subclass and numpy would turn strings into floats: check exactly.
            if not all(type(v) is float or type(v) is int for v in vector):
                raise _fail(
                    "an embedding holds values that are not numbers.",
                    EmbeddingFailedReason.NON_FLOAT_VALUE,
                )
            if len(vector) != dims:
                raise _fail(
                    f"the embedding service returned {len(vector)} dimensions, expected {dims}.",
                    EmbeddingFailedReason.DIMENSIONS_MISMATCH,
                )
            rows[index] = vector
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            raise _fail(
                f"the embedding service returned no vector for {len(missing)} of {n} inputs.",
                EmbeddingFailedReason.MISSING_INDEX,
            )

        # Python floats past float32 range are finite here but not after the cast: check both.
        try:
            values = np.asarray(rows, dtype=np.float64)
        except OverflowError:  # an integer literal beyond any float
            raise _fail(
                "an embedding holds non-finite values.", EmbeddingFailedReason.NON_FINITE_VALUE
            ) from None
        if not np.all(np.isfinite(values)) or not np.all(
            np.abs(values) <= np.finfo(np.float32).max
        ):
            raise _fail(
                "an embedding holds non-finite values.", EmbeddingFailedReason.NON_FINITE_VALUE
            )
        norms = np.linalg.norm(values, axis=1, keepdims=True)
        if np.any(norms == 0) or not np.all(np.isfinite(norms)):
            raise _fail(
                "the embedding service returned a zero vector.", EmbeddingFailedReason.ZERO_VECTOR
            )
        # A fresh array: the parsed values are never normalised in place.
        unit = (values / norms).astype(np.float32)
        return unit, tokens


def _config_error(detail: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST, detail, reason=InvalidRequestReason.EMBEDDING_CONFIG
    )


def _too_large() -> RetrievalError:
    return _fail(
        "the embedding response is larger than expected.", EmbeddingFailedReason.MALFORMED_RESPONSE
    )


def _prompt_tokens(usage: object) -> int:
    """`usage.prompt_tokens` when reported; 0 when the server reports no usage."""
    if usage is None:
        return 0
    if not isinstance(usage, dict):
        raise _fail(
            "the embedding response reports malformed usage.",
            EmbeddingFailedReason.MALFORMED_RESPONSE,
        )
    reported = usage.get("prompt_tokens")
    if reported is None:
        return 0
    tokens = token_count(reported)  # beyond what a usage record holds: malformed too
    if tokens is None:
        raise _fail(
            "the embedding response reports malformed usage.",
            EmbeddingFailedReason.MALFORMED_RESPONSE,
        )
    return tokens

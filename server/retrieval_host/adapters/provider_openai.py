"""OpenAI-compatible chat completions, streamed (`POST {base_url}/chat/completions`).

One model call per `generate`: the request carries the run's messages (system, user, the
assistant's tool calls and the tool results, in OpenAI's message format) and, in `tool` mode, the
tools as `function` specs. The answer is read as Server-Sent Events: each content delta becomes a
`TextDelta` as it arrives; tool-call fragments are joined by their `index` and reported as
`ToolCallRequested` once the stream ends, then the `finish_reason` as one `FinishReported`; the
final usage chunk (`stream_options.include_usage`) becomes one `UsageReported` (tokens only: the
engine counts requests). A call whose server sent no usage logs a warning (logger
`retrieval_host.usage`, naming the provider): its usage record counts the request with 0
tokens, which reads as free rather than unknown (probe G, session 42). A server that ignores
`stream` and answers one `chat.completion` JSON object is read the same way. Reading the answer
(`_openai_chat_stream`) does no I/O; this module sends the request and watches the connection.

The `model` a server names in its chunks is not compared with the requested one: hosted APIs
answer with a dated build (`gpt-4o` → `gpt-4o-2024-08-06`) and proxies with their own aliases.
Unlike embeddings, where two builds give incomparable vectors, nothing here depends on the build.

Failures raise `PROVIDER_FAILED` with a `reason`: `http-error` (status and the server's
`error.message`, scrubbed of the key, at most 200 chars), `rate-limited` (429), `stream-error`
(an error object inside the stream), `malformed-chunk` (a data line that is not JSON, or a chunk
of the wrong shape), `stream-ended-early` (the stream ended, or the connection dropped, before
`[DONE]` or a `finish_reason`), `connection-failed`, `timeout` (no byte for `timeout_s`),
`api-key-unavailable`. Nothing is retried: a retry could bill a second answer, and the run's
budget is the caller's.

Cancellation and the run's inactivity timeout are honoured while the server stalls. httpx cannot
resume a stream after a read timeout (the connection is closed on the way out), and closing the
response from another thread does not wake a blocked `recv`, so a watchdog thread polls the
`CancelToken` and, once it is cancelled or idle, shuts the connection's socket down; the blocked
read returns at once and the token's own error (`CANCELLED`, `TIMEOUT`) is raised. Each call
borrows a `ClientLanes` lane, a client of one connection kept alive for up to 1 s idle, whose
socket the watchdog knows; a call is sent once, even when that connection fails first. A stream
is left at its `[DONE]`, or at the usage chunk that follows a `finish_reason` (waiting for the
body's end, or for a `[DONE]` a server never sends, held a finished run until `timeoutS`), so
its connection is closed rather than kept. Only data events count as progress: SSE comments
(a proxy's keep-alives) do not keep an idle run alive.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterator
from typing import Any, Final

import httpx

from retrieval_host.adapters._openai_chat_stream import (
    ChatStream,
    SSEDecoder,
    malformed,
    provider_failed,
    provider_transient,
)
from retrieval_host.adapters._openai_http import (
    ERROR_BODY_BYTES,
    ClientLanes,
    encode_json,
    endpoint_url,
    error_message,
    read_api_key,
    read_capped,
    request_headers,
    scrub,
    tls_verify,
)
from retrieval_host.adapters._socket_watchdog import SocketWatchdog
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason, ProviderFailedReason
from retrieval_host.core.run_ports import GenerationEvent, GenerationRequest, Message, ToolSpec
from retrieval_host_client import retry_after_seconds

__all__ = ["OpenAIChatProvider"]

_USER_AGENT: Final = "retrieval-host (provider-openai)"
# Where metering problems are logged (as `usage not recorded` is).
_usage_log = logging.getLogger("retrieval_host.usage")
# A bound on what a server can make the client hold in memory (the stream's are with its reader).
_MAX_JSON_RESPONSE_BYTES: Final = 8 * 1024 * 1024


def _key_unavailable(detail: str) -> RetrievalError:
    return provider_failed(detail, ProviderFailedReason.API_KEY_UNAVAILABLE)


def _config_error(detail: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST, detail, reason=InvalidRequestReason.PROVIDER_CONFIG
    )


class OpenAIChatProvider:
    """The OpenAI-compatible generation provider (implements `core.run_ports.GenerationProvider`).

    - `base_url`: the API root, e.g. `https://api.openai.com/v1` (`/chat/completions` is added).
    - `api_key`: called for each request; None sends no `Authorization` header (local servers).
      The key is sent only in that header and scrubbed from every error detail.
    - `timeout_s`: the longest wait for any one step (connect, send, each read) before
      `PROVIDER_FAILED`/`timeout`. The run's own `idleTimeoutMs` and cancellation act sooner.
    - `verify`: True (system CAs), False, a CA bundle path, or an `ssl.SSLContext`. Proxy
      environment variables and `.netrc` are ignored, and redirects are not followed.
    - `max_output_tokens`: sent as `max_completion_tokens` when set.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: Callable[[], str] | None,
        timeout_s: float = 120.0,
        verify: str | bool | ssl.SSLContext = True,
        max_output_tokens: int | None = None,
        account_id: str | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise _config_error("timeout_s must be positive.")
        # Who pays for this instance's calls, as the operator names it (usage records).
        self.account_id = account_id
        if max_output_tokens is not None and max_output_tokens < 1:
            raise _config_error("max_output_tokens must be positive.")
        self._url = endpoint_url(base_url, "/chat/completions", _config_error)
        self._api_key = api_key
        self._max_output_tokens = max_output_tokens
        self._timeout_s = timeout_s
        self._lanes = ClientLanes(
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify, _config_error),
            headers={"Accept": "text/event-stream", "User-Agent": _USER_AGENT},
        )

    @property
    def kind(self) -> str:
        return "openai"

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        """Stream one model call's events; raises `PROVIDER_FAILED` (never retries)."""
        cancel.check()
        key = read_api_key(self._api_key, "generation", _key_unavailable)
        content = encode_json(self._body(request))
        stream = ChatStream(request.step)
        with self._lanes.lane() as lane:
            watchdog = SocketWatchdog(cancel, "provider-watchdog", lane.slot)
            watchdog.start()
            try:
                yield from self._exchange(lane.client, content, key, stream, watchdog, cancel)
            finally:
                watchdog.stop()
        yield from stream.finish()
        if not stream.usage_reported:
            self._warn_no_usage(request)

    def _warn_no_usage(self, request: GenerationRequest) -> None:
        # A compatible server that ignores `stream_options.include_usage` (or an API that does
        # not count) leaves the call's usage record at 0 tokens: said once per call, so an
        # operator reading usage knows those zeros are unknown, not free.
        _usage_log.warning(
            "generation provider %r reported no token usage for a model call; its usage "
            "record counts the request with 0 tokens",
            request.provider or self.kind,
            extra={
                "fields": {
                    "provider": request.provider or None,
                    "kind": self.kind,
                    "account": self.account_id,
                    "model": request.model,
                    "runId": request.run_id or None,
                    "step": request.step,
                }
            },
        )

    def close(self) -> None:
        """Close the kept-alive connections. The provider cannot be used afterwards."""
        self._lanes.close()

    def __enter__(self) -> OpenAIChatProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the request -----------------------------------------------------------------------

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [_message(m) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if self._max_output_tokens is not None:
            body["max_completion_tokens"] = self._max_output_tokens
        return body

    # --- the exchange ------------------------------------------------------------------------

    def _exchange(
        self,
        client: httpx.Client,
        content: bytes,
        key: str | None,
        stream: ChatStream,
        watchdog: SocketWatchdog,
        cancel: CancelToken,
    ) -> Iterator[GenerationEvent]:
        started = False  # the response status line has arrived
        try:
            with client.stream(
                "POST",
                self._url,
                content=content,
                headers=request_headers(key),
                extensions={"trace": watchdog.trace},
            ) as resp:
                started = True
                try:
                    cancel.progress()
                    yield from self._read(resp, key, stream, cancel)
                finally:
                    # Before the response closes its socket, so the watchdog cannot shut down
                    # a descriptor number that a new connection might reuse.
                    watchdog.stop()
        except httpx.TimeoutException:
            watchdog.raise_if_tripped()
            raise provider_transient(
                f"the generation provider did not answer within {self._timeout_s} s.",
                ProviderFailedReason.TIMEOUT,
            ) from None
        except httpx.HTTPError as exc:
            watchdog.raise_if_tripped()
            # The exception text can carry the URL; only its class name is safe to show.
            if started:
                raise provider_transient(
                    f"the connection to the generation provider closed mid-stream "
                    f"({type(exc).__name__}).",
                    ProviderFailedReason.STREAM_ENDED_EARLY,
                ) from None
            raise provider_transient(
                f"could not reach the generation provider ({type(exc).__name__}).",
                ProviderFailedReason.CONNECTION_FAILED,
            ) from None

    def _read(
        self, resp: httpx.Response, key: str | None, stream: ChatStream, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        if resp.status_code != 200:
            raw = read_capped(resp, ERROR_BODY_BYTES, truncate=True)
            raise _status_error(resp.status_code, raw, key, resp.headers.get("retry-after"))
        media_type = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type == "application/json":
            raw = read_capped(
                resp, _MAX_JSON_RESPONSE_BYTES, truncate=False, too_large=_json_too_large
            )
            cancel.progress()
            yield from stream.completion(raw, key)
            return
        if media_type in _PAGES:
            # A baseUrl that is not the API's, or a proxy's page: not a stream that ended early
            # (which points at the connection, and is retried; probe B, session 35).
            raise malformed(
                f"a page ({media_type}) with status 200, not an event stream or JSON (is "
                "baseUrl the API's?)."
            )
        decoder = SSEDecoder()
        # iter_bytes, not iter_raw: a proxy may compress the stream.
        for chunk in resp.iter_bytes():
            cancel.check()
            for data in decoder.feed(chunk):
                yield from self._progressed(stream, data, key, cancel)
                if stream.done or stream.complete:
                    return
        for data in decoder.end():
            yield from self._progressed(stream, data, key, cancel)
            if stream.done or stream.complete:
                return
        # The watchdog shuts a cancelled call's socket down, and a body that ends when the
        # connection closes (no length, no chunking) reads that as its end: a cancel, not a
        # stream the provider ended early.
        cancel.check()

    @staticmethod
    def _progressed(
        stream: ChatStream, data: str, key: str | None, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        # A data event is progress when it brought something (text, a tool call's part, the
        # finish, usage, `[DONE]`); an SSE comment is not, nor an empty delta: a server sending
        # `{"delta": {}}` every 0.2 s kept a run alive past its idle timeout (probe H).
        before, done = stream.received, stream.done
        yield from stream.data(data, key)
        if stream.received != before or stream.done != done:
            cancel.progress()


# --- the wire format of messages and tools ---------------------------------------------------


def _message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            # OpenAI's format: no content (null) beside tool calls, rather than "".
            "content": m.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}


def _tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description,
            "parameters": dict(t.parameters),
        },
    }


_PAGES: Final = frozenset({"text/html", "application/xhtml+xml"})


def _status_error(
    status: int, raw: bytes, key: str | None, retry_after: str | None = None
) -> RetrievalError:
    message = scrub(error_message(raw), key)
    suffix = f": {message}" if message else "."
    if status == 429:
        error = provider_transient(
            f"the generation provider is rate limiting (HTTP 429){suffix}",
            ProviderFailedReason.RATE_LIMITED,
        )
        error.retry_after_s = retry_after_seconds(retry_after)
        return error
    detail = f"the generation provider answered HTTP {status}{suffix}"
    if status >= 500:  # a server error may pass
        error = provider_transient(detail, ProviderFailedReason.HTTP_ERROR)
        error.retry_after_s = retry_after_seconds(retry_after)
        return error
    # A client error (bad request, key, model) would come again.
    return provider_failed(detail, ProviderFailedReason.HTTP_ERROR)


def _json_too_large() -> RetrievalError:
    return malformed("a response larger than expected.")

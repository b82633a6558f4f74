"""OpenAI-compatible chat completions, streamed (`POST {base_url}/chat/completions`).

One model call per `generate`: the request carries the run's messages (system, user, the
assistant's tool calls and the tool results, in OpenAI's message format) and, in `tool` mode, the
tools as `function` specs. The answer is read as Server-Sent Events: each content delta becomes a
`TextDelta` as it arrives; tool-call fragments are joined by their `index` and reported as
`ToolCallRequested` once the stream ends; the final usage chunk (`stream_options.include_usage`)
becomes one `UsageReported` (tokens only: the engine counts requests). A server that ignores
`stream` and answers one `chat.completion` JSON object is read the same way.

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
read returns at once and the token's own error (`CANCELLED`, `TIMEOUT`) is raised. Connections
are not kept alive between calls, so every call has its own socket to shut down. Only data events
count as progress: SSE comments (a proxy's keep-alives) do not keep an idle run alive.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from retrieval_host.adapters._openai_http import (
    ERROR_BODY_BYTES,
    encode_json,
    endpoint_url,
    error_message,
    error_object,
    make_client,
    read_api_key,
    read_capped,
    request_headers,
    scrub,
    tls_verify,
)
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason, ProviderFailedReason
from retrieval_host.core.run_ports import (
    GenerationEvent,
    GenerationRequest,
    Message,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    ToolSpec,
    UsageReported,
)
from retrieval_host.core.runs_model import GenerationUsage

__all__ = ["OpenAIChatProvider"]

_USER_AGENT: Final = "retrieval-host (provider-openai)"
# How often the watchdog looks at the CancelToken: the worst-case delay of a cancellation.
_WATCH_INTERVAL_S: Final = 0.05
# Bounds on what a server can make the client hold in memory.
_MAX_LINE_BYTES: Final = 1024 * 1024
_MAX_JSON_RESPONSE_BYTES: Final = 8 * 1024 * 1024
_MAX_TOOL_CALLS: Final = 128
_MAX_TOOL_ARGUMENT_CHARS: Final = 1024 * 1024
_EOL = re.compile(rb"\r\n|\n|\r")
_SOCKET_EVENTS: Final = ("connection.connect_tcp.complete", "connection.start_tls.complete")


def _key_unavailable(detail: str) -> RetrievalError:
    return _fail(detail, ProviderFailedReason.API_KEY_UNAVAILABLE)


def _fail(detail: str, reason: ProviderFailedReason) -> RetrievalError:
    return RetrievalError(ErrorCode.PROVIDER_FAILED, detail, reason=reason)


def _malformed(detail: str) -> RetrievalError:
    return _fail(f"the generation provider sent {detail}", ProviderFailedReason.MALFORMED_CHUNK)


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
    ) -> None:
        if not timeout_s > 0:
            raise _config_error("timeout_s must be positive.")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise _config_error("max_output_tokens must be positive.")
        self._url = endpoint_url(base_url, "/chat/completions", _config_error)
        self._api_key = api_key
        self._max_output_tokens = max_output_tokens
        self._client = make_client(
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify, _config_error),
            headers={"Accept": "text/event-stream", "User-Agent": _USER_AGENT},
            # A fresh connection per call: the watchdog needs the socket before the first
            # byte arrives, and httpcore reports it only when it connects.
            limits=httpx.Limits(max_keepalive_connections=0),
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
        stream = _ChatStream(request.step)
        watchdog = _Watchdog(cancel)
        watchdog.start()
        try:
            yield from self._exchange(content, key, stream, watchdog, cancel)
        finally:
            watchdog.stop()
        yield from stream.finish()

    def close(self) -> None:
        """Close the HTTP client. The provider cannot be used afterwards."""
        self._client.close()

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
        content: bytes,
        key: str | None,
        stream: _ChatStream,
        watchdog: _Watchdog,
        cancel: CancelToken,
    ) -> Iterator[GenerationEvent]:
        started = False  # the response status line has arrived
        try:
            with self._client.stream(
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
            raise _fail(
                f"the generation provider did not answer within {self._client.timeout.read} s.",
                ProviderFailedReason.TIMEOUT,
            ) from None
        except httpx.HTTPError as exc:
            watchdog.raise_if_tripped()
            # The exception text can carry the URL; only its class name is safe to show.
            if started:
                raise _fail(
                    f"the connection to the generation provider closed mid-stream "
                    f"({type(exc).__name__}).",
                    ProviderFailedReason.STREAM_ENDED_EARLY,
                ) from None
            raise _fail(
                f"could not reach the generation provider ({type(exc).__name__}).",
                ProviderFailedReason.CONNECTION_FAILED,
            ) from None

    def _read(
        self, resp: httpx.Response, key: str | None, stream: _ChatStream, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        if resp.status_code != 200:
            raw = read_capped(resp, ERROR_BODY_BYTES, truncate=True)
            raise _status_error(resp.status_code, raw, key)
        media_type = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type == "application/json":
            raw = read_capped(
                resp, _MAX_JSON_RESPONSE_BYTES, truncate=False, too_large=_json_too_large
            )
            cancel.progress()
            yield from stream.completion(raw, key)
            return
        decoder = _SSEDecoder()
        # iter_bytes, not iter_raw: a proxy may compress the stream.
        for chunk in resp.iter_bytes():
            cancel.check()
            for data in decoder.feed(chunk):
                cancel.progress()  # a data event is real progress; an SSE comment is not
                yield from stream.data(data, key)
                if stream.done:
                    return
        for data in decoder.end():
            cancel.progress()
            yield from stream.data(data, key)
            if stream.done:
                return


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


def _status_error(status: int, raw: bytes, key: str | None) -> RetrievalError:
    message = scrub(error_message(raw), key)
    suffix = f": {message}" if message else "."
    if status == 429:
        return _fail(
            f"the generation provider is rate limiting (HTTP 429){suffix}",
            ProviderFailedReason.RATE_LIMITED,
        )
    return _fail(
        f"the generation provider answered HTTP {status}{suffix}", ProviderFailedReason.HTTP_ERROR
    )


def _json_too_large() -> RetrievalError:
    return _malformed("a response larger than expected.")


# --- Server-Sent Events ------------------------------------------------------------------------


class _SSEDecoder:
    """Incremental SSE decoding (the `data` field only): bytes in, one string per event out.

    Lines end in CRLF, LF or CR; `data:` lines of one event are joined with LF; comments and
    other fields (`event`, `id`, `retry`) are ignored; a blank line ends an event.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events: list[str] = []
        start = 0
        while True:
            match = _EOL.search(self._buffer, start)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # maybe the first half of a CRLF split across reads
            event = self._line(bytes(self._buffer[start : match.start()]))
            if event is not None:
                events.append(event)
            start = match.end()
        del self._buffer[:start]
        if len(self._buffer) > _MAX_LINE_BYTES:
            raise _malformed(f"a stream line longer than {_MAX_LINE_BYTES} bytes.")
        return events

    def end(self) -> list[str]:
        """Events still pending when the body ends (a last event without its blank line)."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, raw: bytes) -> str | None:
        if not raw:
            if not self._data:
                return None
            event = "\n".join(self._data)
            self._data = []
            return event
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("a stream line that is not UTF-8.") from None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None


# --- chunks to events ------------------------------------------------------------------------


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


class _ChatStream:
    """The state of one answer: what was seen, the tool calls being assembled, the usage."""

    def __init__(self, step: int) -> None:
        self._step = step
        self._calls: dict[int, _PartialCall] = {}
        self._argument_chars = 0
        self._usage: GenerationUsage | None = None
        self._finished = False  # a finish_reason arrived
        self.done = False  # `[DONE]` arrived

    def data(self, data: str, key: str | None) -> Iterator[GenerationEvent]:
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise _malformed("a stream chunk that is not JSON.") from None
        if not isinstance(chunk, dict):
            raise _malformed("a stream chunk that is not a JSON object.")
        error = error_object(chunk)
        if error:
            message = error.get("message")
            shown = scrub(message, key) if isinstance(message, str) else ""
            raise _fail(
                f"the generation provider reported an error mid-stream: {shown or 'no message'}",
                ProviderFailedReason.STREAM_ERROR,
            )
        choices = chunk.get("choices", [])
        if not isinstance(choices, list):
            raise _malformed("a chunk whose choices are not a list.")
        for choice in choices:
            if not isinstance(choice, dict):
                raise _malformed("a choice that is not an object.")
            if choice.get("index", 0) != 0:
                continue  # n=1 is requested; other choices are not this answer
            delta = choice.get("delta")
            if delta is not None:
                yield from self._delta(delta)
            self._finish(choice.get("finish_reason"))
        self._read_usage(chunk.get("usage"))

    def completion(self, raw: bytes, key: str | None) -> Iterator[GenerationEvent]:
        """A whole `chat.completion` object (a server that did not stream)."""
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise _malformed("a response that is not JSON.") from None
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices:
            raise _malformed("a response without choices.")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise _malformed("a response whose choice has no message.")
        message = dict(choice["message"])
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            # The message form has no `index`: a call's position is its index.
            message["tool_calls"] = [
                {**c, "index": i} if isinstance(c, dict) else c for i, c in enumerate(calls)
            ]
        yield from self._delta(message)
        self._finish(choice.get("finish_reason") or "stop")
        self._read_usage(doc.get("usage"))
        self.done = True

    def finish(self) -> Iterator[GenerationEvent]:
        """The events due at the end: the assembled tool calls, then the usage."""
        if not self.done and not self._finished:
            raise _fail(
                "the generation provider's stream ended before the answer was complete.",
                ProviderFailedReason.STREAM_ENDED_EARLY,
            )
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise _malformed(f"a tool call (index {index}) without a function name.")
            # Some compatible servers send no id; the engine needs one to pair the result.
            call_id = call.id or f"call_{self._step}_{index}"
            yield ToolCallRequested(ToolCall(call_id, call.name, call.arguments))
        if self._usage is not None:
            yield UsageReported(self._usage)

    def _delta(self, delta: object) -> Iterator[GenerationEvent]:
        if not isinstance(delta, dict):
            raise _malformed("a delta that is not an object.")
        for field in ("content", "refusal"):
            # A refusal is the model's answer too: the caller sees it rather than nothing.
            text = delta.get(field)
            if text is None:
                continue
            if not isinstance(text, str):
                raise _malformed(f"a delta whose {field} is not text.")
            if text:
                yield TextDelta(text)
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            raise _malformed("tool calls that are not a list.")
        for fragment in calls:
            self._tool_fragment(fragment)

    def _tool_fragment(self, fragment: object) -> None:
        if not isinstance(fragment, dict):
            raise _malformed("a tool call that is not an object.")
        index = fragment.get("index")
        if type(index) is not int or not 0 <= index < _MAX_TOOL_CALLS:
            raise _malformed("a tool call without a valid index.")
        call = self._calls.setdefault(index, _PartialCall())
        call_id = fragment.get("id")
        if call_id is not None:
            if not isinstance(call_id, str):
                raise _malformed("a tool call whose id is not text.")
            if call_id and call.id and call_id != call.id:
                raise _malformed(f"two ids for the tool call with index {index}.")
            call.id = call.id or call_id
        function = fragment.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise _malformed("a tool call whose function is not an object.")
        for field in ("name", "arguments"):
            part = function.get(field)
            if part is None:
                continue
            if not isinstance(part, str):
                raise _malformed(f"a tool call whose {field} is not text.")
            if field == "name":
                call.name += part
            else:
                self._argument_chars += len(part)
                if self._argument_chars > _MAX_TOOL_ARGUMENT_CHARS:
                    raise _malformed("tool-call arguments larger than expected.")
                call.arguments += part

    def _finish(self, reason: object) -> None:
        if reason is None:
            return
        if not isinstance(reason, str):
            raise _malformed("a finish_reason that is not text.")
        self._finished = True

    def _read_usage(self, usage: object) -> None:
        # Servers that report usage on every chunk report running totals: the last one counts.
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise _malformed("usage that is not an object.")
        counts = [usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)]
        if not all(type(n) is int and n >= 0 for n in counts):
            raise _malformed("usage whose token counts are not counts.")
        self._usage = GenerationUsage(input_tokens=counts[0], output_tokens=counts[1])


# --- cancellation ----------------------------------------------------------------------------


class _Watchdog:
    """Shuts the call's socket down once the token is cancelled or idle (see the module doc).

    `trace` is httpcore's documented trace hook: it runs on the caller's thread at each phase
    of the request, and hands over the network stream when a connection (or its TLS layer) is
    made.
    """

    def __init__(self, cancel: CancelToken) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._stream: Any = None
        self._tripped: RetrievalError | None = None
        self._thread = threading.Thread(target=self._watch, name="provider-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            self._stream = None

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event not in _SOCKET_EVENTS:
            return
        with self._lock:
            self._stream = info.get("return_value")
            if self._tripped is not None:
                self._shutdown()  # tripped while connecting

    def raise_if_tripped(self) -> None:
        with self._lock:
            tripped = self._tripped
        if tripped is not None:
            raise tripped
        # Cancelled or idle at the moment of a transport error: report that, not the error.
        self._cancel.check()

    def _watch(self) -> None:
        while not self._stopped.wait(_WATCH_INTERVAL_S):
            try:
                self._cancel.check()
            except RetrievalError as error:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._tripped = error
                    self._shutdown()
                return

    def _shutdown(self) -> None:
        stream = self._stream
        if stream is None:
            return
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            # socket.shutdown, not SSLSocket.shutdown: the TLS object stays to the reader,
            # whose blocked read then ends with an EOF.
            with contextlib.suppress(OSError):  # already closed
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

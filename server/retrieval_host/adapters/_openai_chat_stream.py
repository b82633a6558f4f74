"""Reading one chat-completions answer: SSE bytes to data events, chunks to `GenerationEvent`s.

No I/O here: `OpenAIChatProvider` feeds the body's bytes to `SSEDecoder` and each data event to
`ChatStream` (or a whole `chat.completion` object, when a server did not stream), and asks
`ChatStream.finish` for the events due at the end. Content deltas become `TextDelta`s at once;
tool-call fragments are joined by their `index` and reported as `ToolCallRequested` at the end,
then how the answer ended (`FinishReported`: OpenAI's `finish_reason` as a `FinishReason`) and
the usage. Whatever breaks the expected shape raises `PROVIDER_FAILED` with the reason
`malformed-chunk`, `stream-error` or `stream-ended-early`; the bounds below cap what a server can
make the host hold in memory.

The answer is complete at `[DONE]`, or once the usage chunk (`choices: []` with `usage`, the
last thing `stream_options.include_usage` asks for) follows a `finish_reason`
(`ChatStream.complete`): a server that sent all that and then neither `[DONE]` nor the end of
the body held a finished run until `timeoutS` failed it (probe G, session 42).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from retrieval_host.adapters._openai_http import error_object, scrub, token_count
from retrieval_host.core.errors import ErrorCode, RetrievalError, TransientError
from retrieval_host.core.reasons import ProviderFailedReason
from retrieval_host.core.run_ports import (
    FinishReported,
    GenerationEvent,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    UsageReported,
)
from retrieval_host.core.runs_model import FinishReason, GenerationUsage

__all__ = ["ChatStream", "SSEDecoder", "malformed", "provider_failed"]

# Bounds on what a server can make the client hold in memory.
_MAX_LINE_BYTES: Final = 1024 * 1024
_MAX_TOOL_CALLS: Final = 128
_MAX_TOOL_ARGUMENT_CHARS: Final = 1024 * 1024
_EOL = re.compile(rb"\r\n|\n|\r")
# OpenAI's `finish_reason`s as the host's; any other is `other`. Calling tools (and the older
# `function_call`) is the model ending its answer; so is `[DONE]` without a finish_reason.
_FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    "length": "length",
    "content_filter": "content-filter",
}


def provider_failed(detail: str, reason: ProviderFailedReason) -> RetrievalError:
    """A `PROVIDER_FAILED` error with its reason."""
    return RetrievalError(ErrorCode.PROVIDER_FAILED, detail, reason=reason)


def provider_transient(detail: str, reason: ProviderFailedReason) -> TransientError:
    """A `PROVIDER_FAILED` error a later attempt may not meet (see `TransientError`)."""
    return TransientError(ErrorCode.PROVIDER_FAILED, detail, reason=reason)


def malformed(detail: str) -> RetrievalError:
    """`PROVIDER_FAILED`/`malformed-chunk`: the server sent `detail`."""
    return provider_failed(
        f"the generation provider sent {detail}", ProviderFailedReason.MALFORMED_CHUNK
    )


# --- Server-Sent Events ------------------------------------------------------------------------


class SSEDecoder:
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
            raise malformed(f"a stream line longer than {_MAX_LINE_BYTES} bytes.")
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
            raise malformed("a stream line that is not UTF-8.") from None
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


class ChatStream:
    """The state of one answer: what was seen, the tool calls being assembled, the usage."""

    def __init__(self, step: int) -> None:
        self._step = step
        self._calls: dict[int, _PartialCall] = {}
        self._argument_chars = 0
        self._usage: GenerationUsage | None = None
        self._finished = False  # a finish_reason arrived
        self._finish_reason: str | None = None
        self.done = False  # `[DONE]` arrived
        # The usage chunk arrived after the finish_reason: nothing of the answer is left.
        self.complete = False
        # Grows with what the answer received (text, tool call parts, a finish, usage): a data
        # event that leaves it alone (`{"delta": {}}`, `"content": ""`) is no progress.
        self.received = 0

    def data(self, data: str, key: str | None) -> Iterator[GenerationEvent]:
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise malformed("a stream chunk that is not JSON.") from None
        if not isinstance(chunk, dict):
            raise malformed("a stream chunk that is not a JSON object.")
        error = error_object(chunk)
        if error:
            message = error.get("message")
            shown = scrub(message, key) if isinstance(message, str) else ""
            raise provider_transient(
                f"the generation provider reported an error mid-stream: {shown or 'no message'}",
                ProviderFailedReason.STREAM_ERROR,
            )
        choices = chunk.get("choices", [])
        if not isinstance(choices, list):
            raise malformed("a chunk whose choices are not a list.")
        finished = self._finished  # before this chunk
        for choice in choices:
            if not isinstance(choice, dict):
                raise malformed("a choice that is not an object.")
            if choice.get("index", 0) != 0:
                continue  # n=1 is requested; other choices are not this answer
            delta = choice.get("delta")
            if delta is not None:
                yield from self._delta(delta)
            self._finish(choice.get("finish_reason"))
        self._read_usage(chunk.get("usage"))
        if finished and not choices and chunk.get("usage") is not None:
            self.complete = True

    def completion(self, raw: bytes, key: str | None) -> Iterator[GenerationEvent]:
        """A whole `chat.completion` object (a server that did not stream)."""
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise malformed("a response that is not JSON.") from None
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices:
            raise malformed("a response without choices.")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise malformed("a response whose choice has no message.")
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

    @property
    def usage_reported(self) -> bool:
        """Whether the server sent the answer's token usage."""
        return self._usage is not None

    def finish(self) -> Iterator[GenerationEvent]:
        """The events due at the end: the assembled tool calls, how the answer ended, then the
        usage."""
        if not self.done and not self._finished:
            raise provider_transient(
                "the generation provider's stream ended before the answer was complete.",
                ProviderFailedReason.STREAM_ENDED_EARLY,
            )
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise malformed(f"a tool call (index {index}) without a function name.")
            # Some compatible servers send no id; the engine needs one to pair the result.
            call_id = call.id or f"call_{self._step}_{index}"
            yield ToolCallRequested(ToolCall(call_id, call.name, call.arguments))
        reason = self._finish_reason
        yield FinishReported("stop" if reason is None else _FINISH_REASONS.get(reason, "other"))
        if self._usage is not None:
            yield UsageReported(self._usage)

    def _delta(self, delta: object) -> Iterator[GenerationEvent]:
        if not isinstance(delta, dict):
            raise malformed("a delta that is not an object.")
        for field in ("content", "refusal"):
            # A refusal is the model's answer too: the caller sees it rather than nothing.
            text = delta.get(field)
            if text is None:
                continue
            if not isinstance(text, str):
                raise malformed(f"a delta whose {field} is not text.")
            if text:
                self.received += len(text)
                yield TextDelta(text)
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            raise malformed("tool calls that are not a list.")
        for fragment in calls:
            self._tool_fragment(fragment)

    def _tool_fragment(self, fragment: object) -> None:
        if not isinstance(fragment, dict):
            raise malformed("a tool call that is not an object.")
        index = fragment.get("index")
        if type(index) is not int or not 0 <= index < _MAX_TOOL_CALLS:
            raise malformed("a tool call without a valid index.")
        call = self._calls.setdefault(index, _PartialCall())
        call_id = fragment.get("id")
        if call_id is not None:
            if not isinstance(call_id, str):
                raise malformed("a tool call whose id is not text.")
            if call_id and call.id and call_id != call.id:
                raise malformed(f"two ids for the tool call with index {index}.")
            self.received += len(call_id)
            call.id = call.id or call_id
        function = fragment.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise malformed("a tool call whose function is not an object.")
        for field in ("name", "arguments"):
            part = function.get(field)
            if part is None:
                continue
            if not isinstance(part, str):
                raise malformed(f"a tool call whose {field} is not text.")
            self.received += len(part)
            if field == "name":
                call.name += part
            else:
                self._argument_chars += len(part)
                if self._argument_chars > _MAX_TOOL_ARGUMENT_CHARS:
                    raise malformed("tool-call arguments larger than expected.")
                call.arguments += part

    def _finish(self, reason: object) -> None:
        if reason is None:
            return
        if not isinstance(reason, str):
            raise malformed("a finish_reason that is not text.")
        self.received += 1
        self._finished = True
        self._finish_reason = reason

    def _read_usage(self, usage: object) -> None:
        # Servers that report usage on every chunk report running totals: the last one counts.
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise malformed("usage that is not an object.")
        # A count beyond what a usage record holds is not a count either (probe H, session 40).
        prompt = token_count(usage.get("prompt_tokens", 0))
        completion = token_count(usage.get("completion_tokens", 0))
        if prompt is None or completion is None:
            raise malformed("usage whose token counts are not counts.")
        self.received += 1
        self._usage = GenerationUsage(input_tokens=prompt, output_tokens=completion)

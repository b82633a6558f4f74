"""Chat answers that end the way a test says, served by `FakeOpenAI` on its chat route.

Probe G (session 42) found three ways an answer's end went unseen: a `finish_reason` of
`length` or `content_filter` recorded as a whole answer, a tool call cut by `length` searched
with half its arguments, and a server that sent the whole answer and its usage but neither
`[DONE]` nor the end of the body. `Endings` answers each chat request with the next queued
`Ending` (and as the fake always does once the queue is empty), so the provider, the engine and
the host meet those streams over real HTTP.

    with Endings(server) as endings:
        endings.queue(Ending(finish="length", text="The battery lasts"))
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from tests.support.fake_openai import (
    CHAT_MODEL_SUFFIX,
    CHAT_PATH,
    FakeOpenAI,
    PlannedResponse,
    PlannedToolCall,
    RecordedRequest,
    Reply,
    StreamControl,
    _chat_completions,  # the fake's own chat route, put back when a test ends
    default_chat_answer,
    json_reply,
)

USAGE: Final = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


@dataclass(frozen=True, slots=True)
class Ending:
    """One answer: its text (None: the fake's default, citing the evidence) or one
    `search_context` call with `tool_arguments` as sent; the `finish_reason` (None: a last
    chunk without one); then the usage chunk (`choices: []`), `[DONE]`, and, with `stall`, a
    stream held open after them until the client hangs up. `json`: one `chat.completion`
    object instead of a stream."""

    finish: str | None = "stop"
    text: str | None = None
    tool_arguments: str | None = None
    usage: bool = True
    done: bool = True
    stall: bool = False
    json: bool = False


class Endings:
    """Queued `Ending`s on a fake's chat route (a context manager: the fake's own route is back
    afterwards)."""

    def __init__(self, server: FakeOpenAI) -> None:
        self._server = server
        self._queue: deque[Ending] = deque()
        self._lock = threading.Lock()
        self.served: list[Ending] = []  # the endings sent so far, in order

    def queue(self, *endings: Ending) -> None:
        with self._lock:
            self._queue.extend(endings)

    def __enter__(self) -> Endings:
        self._server.route("POST", CHAT_PATH, self._answer)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.route("POST", CHAT_PATH, _chat_completions)

    def _answer(self, server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
        with self._lock:
            ending = self._queue.popleft() if self._queue else None
            if ending is not None:
                self.served.append(ending)
        if ending is None:
            return _chat_completions(server, request, number)
        return _reply(request.json, ending, number)


def _plan(body: Any, ending: Ending) -> PlannedResponse:
    if ending.tool_arguments is not None:
        return PlannedResponse(
            tool_calls=[PlannedToolCall("search_context", ending.tool_arguments)]
        )
    if ending.text is not None:
        return PlannedResponse(text=ending.text)
    return default_chat_answer(body)


def _reply(body: Any, ending: Ending, number: int) -> Reply:
    plan = _plan(body, ending)
    text = plan.text if isinstance(plan.text, str) else "".join(plan.text)
    calls = [
        {
            "index": i,
            "id": c.id or f"call_{number}_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(plan.tool_calls)
    ]
    envelope = {
        "id": f"chatcmpl-ending{number}",
        "created": 1_700_000_000,
        "model": body["model"] + CHAT_MODEL_SUFFIX,
    }
    if ending.json:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        choice = {"index": 0, "message": message, "finish_reason": ending.finish}
        doc = {**envelope, "object": "chat.completion", "choices": [choice]}
        return json_reply(200, {**doc, "usage": USAGE} if ending.usage else doc)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**envelope, "object": "chat.completion.chunk", "choices": [choice]}

    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    if text:
        events.append(chunk({"content": text}))
    events += [chunk({"tool_calls": [call]}) for call in calls]
    events.append(chunk({}, ending.finish))
    if ending.usage:
        events.append(
            {**envelope, "object": "chat.completion.chunk", "choices": [], "usage": USAGE}
        )
    if ending.done:
        events.append("[DONE]")
    if ending.stall:
        events.append(StreamControl.STALL)
    return Reply(200, content_type="text/event-stream", stream=_sse(events))


def _sse(events: list[Any]) -> Iterator[bytes | StreamControl]:
    for event in events:
        if isinstance(event, StreamControl):
            yield event
        else:
            data = event if isinstance(event, str) else json.dumps(event)
            yield f"data: {data}\n\n".encode()

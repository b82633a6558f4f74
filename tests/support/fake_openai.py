"""A real HTTP server on 127.0.0.1 speaking the OpenAI wire format, for tests of hosted adapters.

It answers `POST /v1/embeddings` like the real API (bearer key check, OpenAI error bodies,
`dimensions` shortening with re-normalisation, `usage.prompt_tokens`) with deterministic
hash-seeded vectors, counts and records every API request, and misbehaves on demand
(`set_mode`). Routes live in a table (`route(method, path, handler)`); a handler may return a
streamed body (chunked transfer encoding) for Server-Sent Events, with `StreamControl` items to
stall or drop the connection mid-body.

`POST /v1/chat/completions` streams `chat.completion.chunk` objects as `data: ...` events (a final
usage chunk when `stream_options.include_usage`, then `data: [DONE]`) or answers one
`chat.completion` object when not streaming. It checks the message sequence like the real API
(every assistant tool call answered by a `tool` message, and none without one). Deterministic by
default: with tools and no tool result yet it calls `search_context` with the question; otherwise
it answers "Based on the evidence [source:a] [source:b]." citing every handle in the last user
message and the tool results. Tests plan other answers with `script_chat`, and make it misbehave
with `set_chat_mode` (stall, drop mid-stream, malformed chunk, 500, 429, ...).

    with FakeOpenAI() as server:
        server.base_url        # "http://127.0.0.1:<port>/v1"
        server.requests_count  # API requests received so far (the readiness probe excluded)
        server.set_mode("server-error", after=1)  # the second request onwards fails
        server.chat_requests_count  # chat completion requests only
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import http.client
import json
import re
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal

import numpy as np

DEFAULT_API_KEY: Final = "sk-test-fake-key-0123456789abcdefghij"
CHAT_PATH: Final = "/v1/chat/completions"
EMBEDDINGS_PATH: Final = "/v1/embeddings"
# The date suffix the fake adds to a requested chat model, as hosted APIs name their builds.
CHAT_MODEL_SUFFIX: Final = "-2024-08-06"

Mode = Literal[
    "ok",
    "shuffled",  # data items in a permuted order (indices still right)
    "wrong-model",  # another model's name
    "dated-model",  # the requested name with a date suffix
    "no-model",  # the `model` field omitted
    "wrong-dims",  # one dimension short
    "duplicate-index",  # the first index twice, the last one missing (needs two inputs)
    "missing-index",  # the last item dropped
    "extra-index",  # one more item, with index == len(input)
    "nan",  # NaN in the first vector (Python's JSON writes the non-standard literal)
    "infinity",
    "zero-vector",  # the first vector all zeros
    "string-values",  # the first vector's numbers as strings
    "base64-values",  # the first embedding as a base64 string despite encoding_format=float
    "bool-index",  # `index: true` instead of an integer
    "no-usage",  # the `usage` object omitted
    "server-error",  # 500 with an OpenAI error body
    "server-error-echo-key",  # 500 whose message echoes the bearer key it was sent
    "html-error",  # 502 with an HTML page body
    "rate-limited",  # 429 with an OpenAI error body
    "malformed-json",  # 200 with a truncated JSON body
    "wrong-shape",  # 200 with `data` as an object
    "slow",  # waits `delay_s` before answering normally (for client timeouts)
    "reject-dimensions",  # 400 like models that do not accept `dimensions`
    "drop-connection",  # closes the socket without answering
]


ChatMode = Literal[
    "ok",
    "stall",  # headers and the first `chunks` events, then silence until released or hung up
    "fail-mid-stream",  # the connection closed after `chunks` events (no terminating chunk)
    "malformed-chunk",  # after `chunks` events, a data line that is not JSON
    "wrong-shape",  # after `chunks` events, a chunk whose `choices` is an object
    "error-event",  # after `chunks` events, `data: {"error": {...}}` and the end of the body
    "no-done",  # a clean end of body with neither a finish_reason nor `[DONE]`
    "server-error",  # 500 with an OpenAI error body
    "server-error-echo-key",  # 500 whose message echoes the bearer key it was sent
    "rate-limited",  # 429 with an OpenAI error body
    "drop-connection",  # closes the socket without answering
    "ignore-stream",  # one `chat.completion` JSON object although `stream` was requested
    "html-page",  # 200 with an HTML page (a baseUrl that is not the API's, a proxy's page)
]


class StreamControl(enum.Enum):
    """Items a streamed `Reply` may hold besides bytes."""

    STALL = "stall"  # send nothing until released, the client hangs up or the server stops
    DROP = "drop"  # close the connection here, without the terminating chunk


@dataclass(frozen=True, slots=True)
class PlannedToolCall:
    """A tool call the fake model makes; `arguments` is the raw JSON text it streams."""

    name: str
    arguments: str
    id: str | None = None  # default: "call_<request>_<index>"


@dataclass(frozen=True, slots=True)
class PlannedResponse:
    """One planned chat answer.

    `text` is streamed as given (a sequence: one delta per item; a string: one delta per word).
    Tool-call arguments are streamed in `fragment`-character pieces, the calls one after another
    like OpenAI does, or round-robin when `interleave`. `usage` is (prompt, completion) tokens;
    None counts them with `fake_token_count`.
    """

    text: str | Sequence[str] = ""
    tool_calls: Sequence[PlannedToolCall] = ()
    usage: tuple[int, int] | None = None
    fragment: int = 4
    interleave: bool = False
    model: str | None = None  # the model named in the chunks; default: a dated build


@dataclass(frozen=True, slots=True)
class FakeModel:
    """An embedding model the fake serves: its native size and whether it takes `dimensions`."""

    native_dimensions: int
    supports_dimensions: bool = True


DEFAULT_MODELS: Final[Mapping[str, FakeModel]] = {
    "text-embedding-3-small": FakeModel(1536),
    "text-embedding-3-large": FakeModel(3072),
    "text-embedding-ada-002": FakeModel(1536, supports_dimensions=False),
}


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One API request as received: headers are lower-cased; `json` is None if not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any
    # The client's address and port: requests from one port came over one connection.
    peer: tuple[str, int] = ("", 0)


@dataclass(slots=True)
class Reply:
    """What a route handler answers. `stream` (if set) is sent chunked instead of `body`."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: Iterable[bytes | StreamControl] | None = None
    drop: bool = False  # close the connection without answering


Handler = Callable[["FakeOpenAI", RecordedRequest, int], Reply]
"""A route: (server, request, 1-based number of this API request) -> reply."""


def json_reply(status: int, doc: object) -> Reply:
    return Reply(status, json.dumps(doc).encode("utf-8"))


def openai_error(
    status: int, message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> Reply:
    """An error in OpenAI's body shape: {"error": {message, type, param, code}}."""
    return json_reply(
        status, {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def fake_vector(model: str, text: str, native: int, dimensions: int | None) -> list[float]:
    """The deterministic unit vector the fake returns for `text` (shortened like OpenAI's)."""
    seed = int.from_bytes(hashlib.sha256(f"{model}\0{text}".encode()).digest()[:8], "big")
    full = np.random.default_rng(seed).standard_normal(native)
    cut = full[: dimensions or native]
    values: list[float] = (cut / np.linalg.norm(cut)).tolist()
    return values


def fake_token_count(text: str) -> int:
    """The fake's own token count (about four UTF-8 bytes per token, like English BPE)."""
    return len(text.encode("utf-8")) // 4 + 1


class FakeOpenAI:
    """A loopback OpenAI-compatible server; start with `with FakeOpenAI() as server:`."""

    def __init__(
        self,
        *,
        api_key: str | None = DEFAULT_API_KEY,
        models: Mapping[str, FakeModel] = DEFAULT_MODELS,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.api_key = api_key
        self.models = dict(models)
        self._tls = tls
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], Handler] = {}
        self._records: list[RecordedRequest] = []
        self._mode: Mode = "ok"
        self._mode_after = 0
        self._delay_s = 5.0
        self._release = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._chat_mode: ChatMode = "ok"
        self._chat_after = 0
        self._chat_chunks = 1
        self._chat_write_size: int | None = None
        self._chat_crlf = False
        self._chat_times: int | None = None
        self._chat_number = 0
        self._script: deque[PlannedResponse] = deque()
        self._unstall = threading.Event()
        self._stalling = 0
        self._disconnects = 0
        self.route("POST", "/v1/embeddings", _embeddings)
        self.route("POST", "/v1/chat/completions", _chat_completions)

    # --- configuration ---------------------------------------------------------------------

    def route(self, method: str, path: str, handler: Handler) -> None:
        """Add or replace the handler of `method path` (e.g. "POST", "/v1/chat/completions")."""
        with self._lock:
            self._routes[(method.upper(), path)] = handler

    def set_mode(self, mode: Mode, *, after: int = 0, delay_s: float = 5.0) -> None:
        """Misbehave as `mode` for every API request after the first `after` ones."""
        with self._lock:
            self._mode = mode
            self._mode_after = after
            self._delay_s = delay_s

    def mode_for(self, number: int) -> Mode:
        """The mode in force for the `number`-th (1-based) API request."""
        with self._lock:
            return self._mode if number > self._mode_after else "ok"

    def set_chat_mode(
        self,
        mode: ChatMode,
        *,
        after: int = 0,
        chunks: int = 1,
        write_size: int | None = None,
        crlf: bool = False,
        times: int | None = None,
    ) -> None:
        """Misbehave as `mode` for every chat request after the first `after` ones; with
        `times`, only for `times` requests after the next `after` (counted from now), then
        answer normally again.

        `chunks`: the events sent before a stall, drop or bad chunk. `write_size`: send the body
        in writes of that many bytes (events split mid-line). `crlf`: end SSE lines with CRLF.
        """
        with self._lock:
            self._chat_mode = mode
            self._chat_after = after if times is None else self._chat_number + after
            self._chat_chunks = chunks
            self._chat_write_size = write_size
            self._chat_crlf = crlf
            self._chat_times = times
            self._unstall.clear()

    def script_chat(self, responses: Iterable[PlannedResponse]) -> None:
        """Queue planned answers, used one per chat request; then the default behaviour."""
        with self._lock:
            self._script.extend(responses)

    def release_stalls(self) -> None:
        """Let stalled streams go on (until the next `set_chat_mode`)."""
        self._unstall.set()

    def wait(self, seconds: float) -> None:
        """Block a handler up to `seconds`; returns early when the server stops."""
        self._release.wait(seconds)

    @property
    def delay_s(self) -> float:
        with self._lock:
            return self._delay_s

    # --- observation -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the fake server is not running")
        host, port = self._httpd.server_address[:2]
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host!s}:{port}/v1"

    @property
    def requests_count(self) -> int:
        """API requests received (any route, any outcome); the readiness probe is not counted."""
        with self._lock:
            return len(self._records)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._records)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """Chat completion requests, in order (their `json` is the body the model received)."""
        with self._lock:
            return [r for r in self._records if r.path == CHAT_PATH]

    @property
    def chat_requests_count(self) -> int:
        return len(self.chat_requests)

    @property
    def embedding_requests_count(self) -> int:
        with self._lock:
            return sum(1 for r in self._records if r.path == EMBEDDINGS_PATH)

    @property
    def open_connections(self) -> int:
        """Client connections the server holds open now (the readiness probe's was released
        before `start` returned)."""
        assert self._httpd is not None
        return self._httpd.connection_count()

    @property
    def chat_disconnects(self) -> int:
        """Stalled streams whose client hung up."""
        with self._lock:
            return self._disconnects

    @property
    def stalled_streams(self) -> int:
        """Handlers holding a stalled stream open right now (waiting for release or hang-up)."""
        with self._lock:
            return self._stalling

    def _count_stall(self, change: int) -> None:
        with self._lock:
            self._stalling += change

    def reset(self) -> None:
        """Forget recorded requests and scripts, and go back to modes "ok"."""
        with self._lock:
            self._records.clear()
            self._mode, self._mode_after = "ok", 0
            self._chat_mode, self._chat_after, self._chat_chunks = "ok", 0, 1
            self._chat_write_size, self._chat_crlf = None, False
            self._chat_times = None
            self._chat_number = 0
            self._script.clear()
            self._disconnects = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._release.clear()
        self._httpd = _Server(("127.0.0.1", 0), _RequestHandler, self)
        if self._tls is not None:
            # The handshake happens on the handler thread, not in the accept loop.
            self._httpd.socket = self._tls.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        self._wait_ready()

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._release.set()  # let slow handlers finish now
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        deadline = time.monotonic() + 10
        while True:
            # http.client rather than httpx: a plain probe whatever the client under test uses.
            probe: http.client.HTTPConnection
            if self._tls is not None:
                probe = http.client.HTTPSConnection(
                    str(host), port, timeout=1.0, context=_unverified_context()
                )
            else:
                probe = http.client.HTTPConnection(str(host), port, timeout=1.0)
            try:
                probe.request("GET", "/health")
                ready = probe.getresponse().status == 200
            except OSError:
                ready = False
            finally:
                probe.close()
            # A probe's connection counts in `open_connections` until its handler thread reads
            # the close, which a loaded machine put off past three whole embedding calls: a
            # test saw 4 connections for its 3 lanes (session 44). So the server is ready once
            # it holds none of them (no one else knows its address yet).
            if ready and self._httpd.wait_for_no_connections(deadline - time.monotonic()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server did not become ready")
            time.sleep(0.01)  # poll interval

    # --- dispatch (called on handler threads) ------------------------------------------------

    def _chat_turn(self) -> tuple[int, ChatMode, PlannedResponse | None]:
        """Number this chat request; its mode and its planned answer (None: the default)."""
        with self._lock:
            self._chat_number += 1
            number = self._chat_number
            times = self._chat_times
            misbehaving = number > self._chat_after and (
                times is None or number <= self._chat_after + times
            )
            mode = self._chat_mode if misbehaving else "ok"
            plan = self._script.popleft() if self._script else None
            return number, mode, plan

    def _chat_settings(self) -> tuple[int, int | None, bool]:
        with self._lock:
            return self._chat_chunks, self._chat_write_size, self._chat_crlf

    def _stall_over(self) -> bool:
        return self._unstall.is_set() or self._release.is_set()

    def _note_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1

    def _dispatch(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self._records.append(request)
            number = len(self._records)
            handler = self._routes.get((request.method, request.path))
        if handler is None:
            return openai_error(
                404, f"Invalid URL ({request.method} {request.path})", type_="invalid_request_error"
            )
        if self.api_key is not None:
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer "):
                return openai_error(
                    401,
                    "You didn't provide an API key.",
                    type_="invalid_request_error",
                )
            if auth.removeprefix("Bearer ") != self.api_key:
                # Like the real API, the message quotes the key it was given (here in full,
                # the worst case a compatible server could do).
                return openai_error(
                    401,
                    f"Incorrect API key provided: {auth.removeprefix('Bearer ')}.",
                    type_="invalid_request_error",
                    code="invalid_api_key",
                )
        return handler(self, request, number)


def _embeddings(server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
    mode = server.mode_for(number)
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    if mode == "drop-connection":
        return Reply(drop=True)
    if mode == "slow":
        server.wait(server.delay_s)
    if mode == "server-error":
        return openai_error(
            500,
            "The server had an error while processing your request. Sorry about that!",
            type_="server_error",
        )
    if mode == "server-error-echo-key":
        return openai_error(500, f"internal failure for key {bearer}", type_="server_error")
    if mode == "html-error":
        return Reply(502, b"<html><body>Bad gateway</body></html>", content_type="text/html")
    if mode == "rate-limited":
        return openai_error(
            429,
            "Rate limit reached for text-embedding-3-small on requests per min (RPM): "
            "Limit 3000, Used 3000, Requested 1.",
            type_="requests",
            code="rate_limit_exceeded",
        )
    if mode == "malformed-json":
        return Reply(200, b'{"object": "list", "data": [{"object": "embedding", "index": 0, "emb')

    body = request.json
    if not isinstance(body, dict):
        return openai_error(400, "We could not parse the JSON body.", type_="invalid_request_error")
    model_name = body.get("model")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(model_name, str):
        return openai_error(
            400, "you must provide a model parameter", type_="invalid_request_error"
        )
    model = server.models.get(model_name)
    if model is None:
        return openai_error(
            404,
            f"The model `{model_name}` does not exist or you do not have access to it.",
            type_="invalid_request_error",
            code="model_not_found",
        )
    if (
        not isinstance(inputs, list)
        or not inputs
        or len(inputs) > 2048
        or not all(isinstance(t, str) and t for t in inputs)
    ):
        return openai_error(
            400, "'$.input' is invalid.", type_="invalid_request_error", param="input"
        )
    if body.get("encoding_format", "float") != "float":
        return openai_error(
            400,
            "This fake supports only encoding_format=float.",
            type_="invalid_request_error",
            param="encoding_format",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (mode == "reject-dimensions" or not model.supports_dimensions):
        return openai_error(
            400,
            "This model does not support specifying dimensions.",
            type_="invalid_request_error",
            param="dimensions",
        )
    if dimensions is not None and (
        type(dimensions) is not int or not 1 <= dimensions <= model.native_dimensions
    ):
        return openai_error(
            400,
            f"Invalid value for 'dimensions' = {dimensions}.",
            type_="invalid_request_error",
            param="dimensions",
        )

    data: list[dict[str, Any]] = [
        {
            "object": "embedding",
            "index": i,
            "embedding": fake_vector(model_name, text, model.native_dimensions, dimensions),
        }
        for i, text in enumerate(inputs)
    ]
    tokens = sum(fake_token_count(t) for t in inputs)
    doc: dict[str, Any] = {
        "object": "list",
        "data": data,
        "model": model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    _misbehave(mode, doc, len(inputs))
    return Reply(200, json.dumps(doc).encode("utf-8"))


def _misbehave(mode: Mode, doc: dict[str, Any], n: int) -> None:
    """Corrupt a correct response `doc` in place as `mode` says."""
    data: list[dict[str, Any]] = doc["data"]
    first = data[0]["embedding"]
    match mode:
        case "shuffled":
            # A rotation: with two or more items, every item leaves its position.
            doc["data"] = data[1:] + data[:1]
        case "wrong-model":
            doc["model"] = "text-embedding-3-large"
        case "dated-model":
            doc["model"] = f"{doc['model']}-2024-01-25"
        case "no-model":
            del doc["model"]
        case "wrong-dims":
            for item in data:
                item["embedding"] = item["embedding"][:-1]
        case "duplicate-index":
            data[-1]["index"] = 0
        case "missing-index":
            data.pop()
        case "extra-index":
            data.append({"object": "embedding", "index": n, "embedding": list(first)})
        case "nan":
            first[0] = float("nan")
        case "infinity":
            first[0] = float("inf")
        case "zero-vector":
            data[0]["embedding"] = [0.0] * len(first)
        case "string-values":
            data[0]["embedding"] = [repr(v) for v in first]
        case "base64-values":
            data[0]["embedding"] = np.asarray(first, dtype="<f4").tobytes().hex()
        case "bool-index":
            data[0]["index"] = True
        case "no-usage":
            del doc["usage"]
        case "wrong-shape":
            doc["data"] = {"embeddings": data}
        case _:
            pass


# --- chat completions ------------------------------------------------------------------------

_HANDLE = re.compile(r"\[source:([^\[\]\s]+)\]")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_CREATED: Final = 1_700_000_000


def _invalid(message: str, param: str | None = None) -> Reply:
    return openai_error(400, message, type_="invalid_request_error", param=param)


def _text_of(content: object) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _check_chat_body(body: Any) -> Reply | None:
    """The 400 the real API gives for a malformed request, or None."""
    if not isinstance(body, dict):
        return _invalid("We could not parse the JSON body of your request.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _invalid("you must provide a model parameter", "model")
    if "stream_options" in body and body.get("stream") is not True:
        return _invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        return _invalid("'$.tools' is invalid.", "tools")
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not _TOOL_NAME.match(function["name"])
            or not isinstance(function.get("parameters", {}), dict)
        ):
            return _invalid("Invalid 'tools': each tool must be a function spec.", "tools")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _invalid("'$.messages' is invalid.", "messages")
    pending: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(message, dict) or role not in _ROLES:
            return _invalid(f"Invalid value for 'messages[{i}].role'.", f"messages.[{i}].role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return _invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            pending.discard(call_id)
            continue
        if pending:
            return _invalid(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(sorted(pending))}",
                "messages",
            )
        content = message.get("content")
        calls = message.get("tool_calls")
        if role == "assistant" and calls is not None:
            if not isinstance(calls, list) or not calls:
                return _invalid(f"Invalid 'messages[{i}].tool_calls'.", f"messages.[{i}]")
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(call, dict)
                    or call.get("type") != "function"
                    or not isinstance(call.get("id"), str)
                    or not isinstance(function, dict)
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                ):
                    return _invalid(f"Invalid 'messages[{i}].tool_calls'.", f"messages.[{i}]")
                pending.add(call["id"])
            if content is not None and not isinstance(content, str):
                return _invalid(f"Invalid 'messages[{i}].content'.", f"messages.[{i}].content")
        elif not isinstance(content, str | list):
            return _invalid(f"Invalid 'messages[{i}].content'.", f"messages.[{i}].content")
    if pending:
        return _invalid(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id': {', '.join(sorted(pending))}",
            "messages",
        )
    return None


def question_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The question in the last user message (the engine writes "Question:\n<text>\n\n...")."""
    users = [_text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    if not users:
        return ""
    text = users[-1]
    if text.startswith("Question:\n"):
        text = text.removeprefix("Question:\n").split("\n\n", 1)[0]
    return text.strip()


def cited_handles(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every `[source:ID]` handle in the last user message and in the tool results, in order."""
    users = [m for m in messages if m.get("role") == "user"]
    texts = [_text_of(m.get("content")) for m in messages if m.get("role") == "tool"]
    if users:
        texts.append(_text_of(users[-1].get("content")))
    return list(dict.fromkeys(h for t in texts for h in _HANDLE.findall(t)))


def default_chat_answer(body: Mapping[str, Any]) -> PlannedResponse:
    """What the fake model says when no answer was scripted."""
    messages: list[Mapping[str, Any]] = body["messages"]
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        arguments = json.dumps({"query": question_of(messages)})
        return PlannedResponse(tool_calls=[PlannedToolCall("search_context", arguments)])
    handles = cited_handles(messages)
    if not handles:
        return PlannedResponse(text="The supplied passages do not answer the question.")
    return PlannedResponse(
        text="Based on the evidence " + " ".join(f"[source:{h}]" for h in handles) + "."
    )


def _deltas(plan: PlannedResponse, number: int) -> list[dict[str, Any]]:
    """The `delta` objects of a planned answer, in streaming order."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "", "refusal": None}]
    pieces = re.findall(r"\S+\s*|\s+", plan.text) if isinstance(plan.text, str) else plan.text
    deltas += [{"content": piece} for piece in pieces]
    per_call: list[list[dict[str, Any]]] = []
    for i, call in enumerate(plan.tool_calls):
        head = {
            "index": i,
            "id": call.id or f"call_{number}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        size = max(1, plan.fragment)
        parts = [call.arguments[k : k + size] for k in range(0, len(call.arguments), size)]
        per_call.append([head] + [{"index": i, "function": {"arguments": part}} for part in parts])
    if plan.interleave:
        longest = max((len(c) for c in per_call), default=0)
        order = [c[k] for k in range(longest) for c in per_call if k < len(c)]
    else:
        order = [fragment for c in per_call for fragment in c]
    deltas += [{"tool_calls": [fragment]} for fragment in order]
    return deltas


def _usage(plan: PlannedResponse, body: Mapping[str, Any]) -> dict[str, int]:
    if plan.usage is not None:
        prompt, completion = plan.usage
    else:
        prompt = sum(fake_token_count(_text_of(m.get("content"))) for m in body["messages"])
        text = plan.text if isinstance(plan.text, str) else "".join(plan.text)
        completion = fake_token_count(text + "".join(c.arguments for c in plan.tool_calls))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(plan: PlannedResponse, body: Mapping[str, Any], number: int) -> dict[str, Any]:
    """The non-streaming `chat.completion` object of a planned answer."""
    text = plan.text if isinstance(plan.text, str) else "".join(plan.text)
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if plan.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{number}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(plan.tool_calls)
        ]
    return {
        "id": f"chatcmpl-fake{number}",
        "object": "chat.completion",
        "created": _CREATED,
        "model": plan.model or body["model"] + CHAT_MODEL_SUFFIX,
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if plan.tool_calls else "stop",
            }
        ],
        "usage": _usage(plan, body),
    }


def _chat_completions(server: FakeOpenAI, request: RecordedRequest, _: int) -> Reply:
    number, mode, plan = server._chat_turn()
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    if mode == "drop-connection":
        return Reply(drop=True)
    if mode == "html-page":
        return Reply(
            200, b"<html><body>Sign in to the portal</body></html>", content_type="text/html"
        )
    if mode == "server-error":
        return openai_error(
            500,
            "The server had an error while processing your request. Sorry about that!",
            type_="server_error",
        )
    if mode == "server-error-echo-key":
        return openai_error(500, f"internal failure for key {bearer}", type_="server_error")
    if mode == "rate-limited":
        limited = openai_error(
            429,
            "Rate limit reached for gpt-4o-mini in organization org-fake on tokens per min "
            "(TPM): Limit 200000, Used 200000, Requested 512. Please try again in 153ms.",
            type_="tokens",
            code="rate_limit_exceeded",
        )
        # OpenAI sends how long to wait (whole seconds) beside the message.
        return dataclasses.replace(limited, headers={**limited.headers, "Retry-After": "1"})
    body = request.json
    invalid = _check_chat_body(body)
    if invalid is not None:
        return invalid
    plan = plan or default_chat_answer(body)
    if body.get("stream") is not True or mode == "ignore-stream":
        return json_reply(200, _completion(plan, body, number))

    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    envelope: dict[str, Any] = {
        "id": f"chatcmpl-fake{number}",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": plan.model or body["model"] + CHAT_MODEL_SUFFIX,
        "system_fingerprint": "fp_fake",
    }
    if include_usage:
        envelope["usage"] = None  # like OpenAI: null on every chunk but the last

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**envelope, "choices": [choice]}

    events: list[Any] = [chunk(d) for d in _deltas(plan, number)]
    events.append(chunk({}, "tool_calls" if plan.tool_calls else "stop"))
    if include_usage:
        events.append({**envelope, "choices": [], "usage": _usage(plan, body)})
    events.append("[DONE]")

    chunks, write_size, crlf = server._chat_settings()
    at = min(chunks, len(events))
    match mode:
        case "stall":
            events.insert(at, StreamControl.STALL)
        case "fail-mid-stream":
            events[at:] = [StreamControl.DROP]
        case "malformed-chunk":
            events.insert(at, '{"id": "chatcmpl-broken", "choices": [{"index": 0, "delta": {"con')
        case "wrong-shape":
            events.insert(at, {**envelope, "choices": {"0": {"delta": {"content": "x"}}}})
        case "error-event":
            error = {"message": f"The model overloaded while serving key {bearer}."}
            events[at:] = [{"error": {**error, "type": "server_error", "code": None}}]
        case "no-done":
            events = [e for e in events if isinstance(e, dict) and e.get("choices")]
            events[-1] = chunk({})  # the finish_reason chunk, without its finish_reason
        case _:
            pass
    return Reply(
        200,
        content_type="text/event-stream; charset=utf-8",
        headers={"Cache-Control": "no-cache"},
        stream=_sse(events, write_size, "\r\n" if crlf else "\n"),
    )


def _sse(
    events: Sequence[Any], write_size: int | None, eol: str
) -> Iterator[bytes | StreamControl]:
    """Events as `data:` lines, one write each (or split into `write_size`-byte writes)."""
    for event in events:
        if isinstance(event, StreamControl):
            yield event
            continue
        data = event if isinstance(event, str) else json.dumps(event)
        raw = f"data: {data}{eol}{eol}".encode()
        if write_size is None:
            yield raw
        else:
            yield from (raw[k : k + write_size] for k in range(0, len(raw), write_size))


def _unverified_context() -> ssl.SSLContext:
    """For the readiness probe only: it checks that the port answers, not who answers."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# --- plumbing ------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close joins the handler threads

    def __init__(
        self, address: tuple[str, int], handler: type[_RequestHandler], app: FakeOpenAI
    ) -> None:
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_changed = threading.Condition()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_changed:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_changed:
            self._conns.discard(request)
            self._conns_changed.notify_all()
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a timeout test, a dropped connection) is expected

    def connection_count(self) -> int:
        with self._conns_changed:
            return len(self._conns)

    def wait_for_no_connections(self, timeout: float) -> bool:
        """Whether every connection was released (its handler done) within `timeout` s."""
        with self._conns_changed:
            return self._conns_changed.wait_for(lambda: not self._conns, max(timeout, 0.0))

    def close_connections(self) -> None:
        """Wake handler threads idling on keep-alive connections so they can be joined."""
        with self._conns_changed:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        if self.command == "GET" and self.path == "/health":
            self._send(Reply(200, b"ok", content_type="text/plain"))
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=raw,
            json=parsed,
            peer=(str(self.client_address[0]), int(self.client_address[1])),
        )
        self._send(self.server.app._dispatch(request))

    def _send(self, reply: Reply) -> None:
        if reply.drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for chunk in reply.stream:
            if chunk is StreamControl.STALL:
                if not self._stall():
                    self.close_connection = True
                    return
            elif chunk is StreamControl.DROP:
                self.close_connection = True
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            elif chunk:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _stall(self) -> bool:
        """Hang mid-body; True when released, False when the client left or the server stops.

        A client waiting for the rest of a response sends nothing, so the socket turning
        readable means it hung up (EOF, or a TLS close_notify).
        """
        app = self.server.app
        app._count_stall(1)
        try:
            while not app._stall_over():
                readable, _, _ = select.select([self.connection], [], [], 0.01)
                if readable:
                    app._note_disconnect()
                    return False
            return not app._release.is_set()
        finally:
            app._count_stall(-1)

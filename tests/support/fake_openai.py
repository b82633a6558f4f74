"""A real HTTP server on 127.0.0.1 speaking the OpenAI wire format, for tests of hosted adapters.

It answers `POST /v1/embeddings` like the real API (bearer key check, OpenAI error bodies,
`dimensions` shortening with re-normalisation, `usage.prompt_tokens`) with deterministic
hash-seeded vectors, counts and records every API request, and misbehaves on demand
(`set_mode`). Routes live in a table (`route(method, path, handler)`) so other endpoints, such as
chat completions, can be added beside embeddings without touching the plumbing; a handler may
return a streamed body (chunked transfer encoding) for Server-Sent Events.

    with FakeOpenAI() as server:
        server.base_url        # "http://127.0.0.1:<port>/v1"
        server.requests_count  # API requests received so far (the readiness probe excluded)
        server.set_mode("server-error", after=1)  # the second request onwards fails
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal

import numpy as np

DEFAULT_API_KEY: Final = "sk-test-fake-key-0123456789abcdefghij"

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


@dataclass(slots=True)
class Reply:
    """What a route handler answers. `stream` (if set) is sent chunked instead of `body`."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: Iterable[bytes] | None = None
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
    ) -> None:
        self.api_key = api_key
        self.models = dict(models)
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], Handler] = {}
        self._records: list[RecordedRequest] = []
        self._mode: Mode = "ok"
        self._mode_after = 0
        self._delay_s = 5.0
        self._release = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.route("POST", "/v1/embeddings", _embeddings)

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
        return f"http://{host!s}:{port}/v1"

    @property
    def requests_count(self) -> int:
        """API requests received (any route, any outcome); the readiness probe is not counted."""
        with self._lock:
            return len(self._records)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._records)

    def reset(self) -> None:
        """Forget recorded requests and go back to mode "ok"."""
        with self._lock:
            self._records.clear()
            self._mode, self._mode_after = "ok", 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._release.clear()
        self._httpd = _Server(("127.0.0.1", 0), _RequestHandler, self)
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
            # http.client rather than httpx: no TLS context to build for a plain loopback probe.
            probe = http.client.HTTPConnection(str(host), port, timeout=1.0)
            try:
                probe.request("GET", "/health")
                if probe.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                probe.close()
            if time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server did not become ready")
            time.sleep(0.01)  # poll interval

    # --- dispatch (called on handler threads) ------------------------------------------------

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


# --- plumbing ------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close joins the handler threads

    def __init__(
        self, address: tuple[str, int], handler: type[_RequestHandler], app: FakeOpenAI
    ) -> None:
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a timeout test, a dropped connection) is expected

    def close_connections(self) -> None:
        """Wake handler threads idling on keep-alive connections so they can be joined."""
        with self._conns_lock:
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
        for chunk in reply.stream:
            if chunk:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

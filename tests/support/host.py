"""Run the real host for tests: a driver over real stores and the local model, served by real
uvicorn over TLS (trustme certificates) in a background thread, with readiness polling.

The shape follows uvicorn's own `tests/utils.py::run_server`: the socket is bound first (port
0, loopback), the server runs `Server.run(sockets=[sock])` in a thread, and the test waits
until `server.started` and `/healthz` answers before using it.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trustme
import uvicorn

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SourceInfo
from retrieval_host.core.ports import (
    AuthorizationRequest,
    CapacityLimits,
    Grant,
    StoredChunk,
    StoredSource,
    VectorStore,
)
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.example_acl import FileAcl
from retrieval_host.http.app import HostApp, create_app
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.serving.server import uvicorn_config
from retrieval_host.serving.tokens import new_token, token_config_entry
from retrieval_host.settings import HostSettings

CORPUS = "library"
BIG_CORPUS = "big"
NAMESPACE = "team"

HANDBOOK = [
    "To rotate a token, create a new one with `retrieval-host token new`, add its hash to the "
    "configuration, deploy it, move clients over, then remove the old hash.",
    "Tokens are stored as SHA-256 hashes; the host never keeps a token itself.",
    "Backups of the SQLite store are taken with the online backup API while the host runs.",
]
SECRET = ["The acquisition closes in March; do not share this outside the board."]


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll `predicate` until it holds (no fixed sleeps: each poll is a short yield).

    `timeout` only bounds a failing test: 30 s, as a full run under load (two test processes
    beside eight busy loops) once took over 10 s for a client's disconnect to reach the fake
    provider through the host's threads."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.002)


@dataclass(frozen=True)
class TlsFiles:
    ca: trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


def make_tls(directory: Path) -> TlsFiles:
    """A trustme CA and a server certificate for 127.0.0.1/localhost, written as PEM files."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = TlsFiles(ca, directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    ca.cert_pem.write_to_path(str(files.ca_file))
    files.cert_file.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(files.key_file))
    files.key_file.chmod(0o600)
    return files


class Gate:
    """An authorizer hook the test controls: requests of `subject` wait for `release`;
    requests of the subject `boom` fail with an unexpected exception."""

    def __init__(self, subject: str = "blocked") -> None:
        self.subject = subject
        self.release = threading.Event()
        self._entered = 0
        self._lock = threading.Lock()

    @property
    def entered(self) -> int:
        with self._lock:
            return self._entered

    def wrap(
        self, authorize: Callable[[AuthorizationRequest, RequestContext], Grant | None]
    ) -> Callable[[AuthorizationRequest, RequestContext], Grant | None]:
        def gated(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
            if context.subject == "boom":
                # An application bug whose message must never reach the caller.
                raise RuntimeError("database password=hunter2 rejected")
            if context.subject == self.subject:
                with self._lock:
                    self._entered += 1
                if not self.release.wait(timeout=30):
                    raise AssertionError("the gate was never released")
            return authorize(request, context)

        return gated


@dataclass
class World:
    """A driver with real stores and the local model, the tokens for it and host settings."""

    directory: Path
    driver: Driver
    stores: dict[str, SqliteVectorStore]
    tokens: dict[str, str]
    token_entries: list[dict[str, Any]]
    tls: TlsFiles
    gate: Gate
    registry: CorpusRevisions
    big_rows: int = 0
    closed: bool = field(default=False)

    def settings(self, **overrides: Any) -> HostSettings:
        data: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "tls": {"certFile": str(self.tls.cert_file), "keyFile": str(self.tls.key_file)},
            "tokens": self.token_entries,
            "configDir": str(self.directory),
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return HostSettings.model_validate(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for store in self.stores.values():
                store.close()


class CorpusRevisions:
    """The example application's view of current revisions when corpora live in different
    stores: each corpus asks its own store (`VectorStore.current_revisions`)."""

    def __init__(self, stores: Mapping[str, VectorStore]) -> None:
        self.stores = stores

    def __call__(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None
    ) -> dict[str, str]:
        return self.stores[corpus].current_revisions(corpus, namespace, source_ids)

    def current(self, corpus: str, namespace: str) -> dict[str, str]:
        """Every source of one namespace at its committed revision."""
        return self(corpus, namespace, None)


ACL = {
    "subjects": {
        "alice": {"namespace": NAMESPACE, "search": ["handbook"], "index": ["*"], "delete": ["*"]},
        "admin": {"namespace": NAMESPACE, "search": ["*"], "index": ["*"], "delete": ["*"]},
        "blocked": {"namespace": NAMESPACE, "search": ["*"], "index": [], "delete": []},
        "boom": {"namespace": NAMESPACE, "search": ["*"], "index": [], "delete": []},
    }
}

# name -> (subject, search, index, delete)
TOKENS: Mapping[str, tuple[str, Sequence[str], Sequence[str], Sequence[str]]] = {
    "alice": ("alice", [CORPUS], [CORPUS], [CORPUS]),
    "bob": ("bob", [], [], []),
    "ghost": ("alice", ["atlantis"], ["atlantis"], ["atlantis"]),
    "admin": ("admin", [CORPUS, BIG_CORPUS], [CORPUS], [CORPUS]),
    "blocked": ("blocked", [CORPUS], [], []),
    "boom": ("boom", [CORPUS], [], []),
    "scribe": ("alice", [], [CORPUS], []),  # may index, not search: an application's writer
}


def build_world(
    directory: Path, embedding: LocalEmbedding, *, big_rows: int = 0, scan_batch_rows: int = 1
) -> World:
    """Index two small sources into `library` (and `big_rows` random rows into `big`)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    acl_file = directory / "acl.json"
    acl_file.write_text(json.dumps(ACL))
    gate = Gate()
    stores = {CORPUS: SqliteVectorStore.open(directory / "store" / "library.sqlite")}
    registry = CorpusRevisions(stores)
    authorize = gate.wrap(FileAcl(acl_file, registry).authorize)
    corpora = [
        Corpus(
            id=CORPUS,
            version="passages-v1",
            embedding=embedding,
            store=stores[CORPUS],
            authorize=authorize,
            chunking=ChunkingSettings().as_identity(),
        )
    ]
    if big_rows:
        stores[BIG_CORPUS] = SqliteVectorStore.open(
            directory / "store" / "big.sqlite", scan_batch_rows=scan_batch_rows
        )
        corpora.append(
            Corpus(
                id=BIG_CORPUS,
                version="passages-v1",
                embedding=embedding,
                store=stores[BIG_CORPUS],
                authorize=authorize,
                limits=CapacityLimits(max_passages_per_source=big_rows),
            )
        )
    # The query cache off: tests count the embedding each search reports, and the same
    # question recurs across tests of one host (the cache has tests of its own).
    driver = Driver(RetrievalService(corpora, query_cache_entries=0))
    admin = RequestContext(subject="admin")
    for source_id, texts in (("handbook", HANDBOOK), ("secret", SECRET)):
        driver.index_context(
            IndexRequest(
                CORPUS,
                SourceInfo(source_id, "r1", f"The {source_id}"),
                [
                    ChunkInput(f"{source_id}-{i}", text, Location(page=1, start_line=i + 1))
                    for i, text in enumerate(texts)
                ],
            ),
            admin,
        )
    if big_rows:
        _fill_big(stores[BIG_CORPUS], big_rows)
    tokens: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    for name, (subject, search, index, delete) in TOKENS.items():
        tokens[name] = new_token()
        entries.append(
            token_config_entry(tokens[name], subject, search=search, index=index, delete=delete)
        )
    return World(
        directory,
        driver,
        stores,
        tokens,
        entries,
        make_tls(directory / "tls"),
        gate,
        registry,
        big_rows,
    )


def _fill_big(store: SqliteVectorStore, rows: int) -> None:
    # Precomputed unit vectors straight into the store: a corpus large enough that a scan in
    # one-row batches takes a noticeable time, without embedding each row.
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((rows, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    source = StoredSource("bulk", "r1", "Bulk", {}, "0" * 64, "f" * 64, rows)
    chunks = [StoredChunk(f"bulk-{i}", i, f"row {i}", Location(), vectors[i]) for i in range(rows)]
    store.replace_source(
        BIG_CORPUS,
        NAMESPACE,
        source,
        chunks,
        expected_revision=None,
        limits=CapacityLimits(max_passages_per_source=rows),
    )


@dataclass
class RunningHost:
    """A host served by uvicorn over TLS on 127.0.0.1, with the event loop it runs on."""

    app: HostApp
    server: uvicorn.Server
    port: int
    tls: TlsFiles
    loop: asyncio.AbstractEventLoop

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        # A bound for a hang, not a pace: a 128 KiB search read for over 30 s on a loaded machine.
        return httpx.Client(
            base_url=self.base_url, verify=self.tls.client_context(), timeout=120, **kwargs
        )

    def task_count(self) -> int:
        """Asyncio tasks alive on the server's loop (the counting task itself excluded)."""

        async def count() -> int:
            return len(asyncio.all_tasks()) - 1

        result: Future[int] = asyncio.run_coroutine_threadsafe(count(), self.loop)
        return result.result(timeout=10)


@contextmanager
def serve_in_thread(
    settings: HostSettings,
    driver: Driver | None,
    tls: TlsFiles,
    environ: Mapping[str, str] | None = None,
) -> Iterator[RunningHost]:
    """Serve `create_app(settings, driver)` with real uvicorn over TLS until the block ends.

    `environ` stands in for the process environment where the settings name secrets (a
    provider's API key). The server runs as `Server.run` would, but keeps a handle on its event
    loop so a test can look at the tasks on it.
    """
    app = create_app(settings, driver)
    server = uvicorn.Server(uvicorn_config(settings, app, dict(environ or {})))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await server.serve(sockets=[sock])

    def run() -> None:
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            runner.run(serve())

    thread = threading.Thread(target=run, name="test-host", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), what="uvicorn start")
        assert thread.is_alive() and loops, "uvicorn exited during startup"
        host = RunningHost(app, server, port, tls, loops[0])
        with host.client() as client:
            wait_until(lambda: _healthy(client), what="/healthz")
        yield host
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


# --- a raw HTTP/1.1 client over TLS, for what httpx will not do (slow or oversized sends) ----


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnection:
    """One TLS connection driven by hand: send bytes, poll for and read a response.

    Polling reads application data (into a buffer) rather than asking whether the socket is
    readable: TLS 1.3 session tickets make it readable before the server has answered.
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.buffer = b""
        self.eof = False

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_quietly(self, data: bytes) -> None:
        """Send, ignoring a connection the server has just closed (the caller checks that)."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.eof = True

    def _read(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except (TimeoutError, ssl.SSLWantReadError, BlockingIOError):
            return
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            self.eof = True
            return
        finally:
            self.sock.settimeout(10.0)
        if chunk:
            self.buffer += chunk
        else:
            self.eof = True

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether the server has sent response bytes (or closed), waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        while not (self.buffer or self.eof):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # One non-blocking attempt: data may be buffered below the TLS layer.
                self._read(0.0)
                return bool(self.buffer or self.eof)
            if not select.select([self.sock], [], [], remaining)[0] and not self.sock.pending():
                continue
            self._read(0.0)
        return True

    def read_until(self, marker: bytes, timeout: float = 10.0) -> bool:
        """Read until `marker` is in the buffer (True), or the server closes or `timeout`
        passes (False)."""
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.eof:
                return False
            self._read(min(remaining, 1.0))
        return True

    def read_response(self) -> RawResponse:
        """Read one response (Content-Length framed)."""
        while b"\r\n\r\n" not in self.buffer:
            if self.eof:
                raise AssertionError(f"connection closed before a response: {self.buffer!r}")
            self._read(10.0)
        head, _, body = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length and not self.eof:
            self._read(10.0)
            body = self.buffer.partition(b"\r\n\r\n")[2]
        self.buffer = body[length:]
        return RawResponse(status, headers, body[:length])

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the connection within `timeout` (the rest is dropped)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if time.monotonic() > deadline:
                return False
            self.buffer = b""
            self._read(max(0.0, deadline - time.monotonic()))
        return True


def raw_connect(host: RunningHost, timeout: float = 10.0) -> RawConnection:
    """A hand-driven TLS connection to the host, handshake done."""
    plain = socket.create_connection(("127.0.0.1", host.port), timeout=timeout)
    return RawConnection(host.tls.client_context().wrap_socket(plain, server_hostname="127.0.0.1"))

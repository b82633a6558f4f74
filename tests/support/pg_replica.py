"""One host "replica" as its own OS process, for the scale-out tests: `python -m` this module.

The process opens its own `PgVectorStore` on the shared database and its own `RetrievalService`
with the real local embedding model, prints `{"ready": ...}` and then answers one JSON command
per stdin line with one JSON line on stdout. Environment: `RH_REPLICA_DSN`, `RH_REPLICA_SCHEMA`,
`RH_REPLICA_NAME` (also the PostgreSQL `application_name` of its connections, so a test can find
its backends in `pg_stat_activity`).

`ReplicaProcess` is the test side: it starts the process, reads its lines through a thread
into a queue, and waits for each answer with a timeout (never unbounded).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from psycopg.conninfo import make_conninfo

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import (
    ANY_REVISION,
    AuthorizationRequest,
    CapacityLimits,
    Grant,
    StoredChunk,
    StoredSource,
)

CORPUS = "docs"
NAMESPACE = "team"
REPO = Path(__file__).resolve().parents[2]


class _AnyRevision(Mapping[str, str]):
    """An index grant for every source at any revision (the tests authorize writes freely)."""

    def __getitem__(self, key: str) -> str:
        return ANY_REVISION

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, key: object) -> bool:
        return True


class _Authorizer:
    def __init__(self) -> None:
        self.search: dict[str, str] = {}

    def __call__(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        if request.operation == "search":
            return Grant(NAMESPACE, dict(self.search))
        return Grant(NAMESPACE, _AnyRevision())


def _error(exc: RetrievalError) -> dict[str, Any]:
    return {"ok": False, "code": exc.code.value, "reason": exc.reason}


def _index_request(source: str, revision: str, texts: list[str]) -> IndexRequest:
    return IndexRequest(
        CORPUS,
        SourceInfo(source, revision, title=f"{source} {revision}"),
        [
            ChunkInput(f"{source}-{i}", text, Location(start_line=i + 1, end_line=i + 1))
            for i, text in enumerate(texts)
        ],
    )


def _synthetic(source: str, revision: str, count: int, dims: int) -> tuple[Any, list[Any]]:
    """A large revision with random vectors, written straight to the store (no embedding)."""
    rng = np.random.default_rng(zlib.crc32(f"{source}\0{revision}".encode()))
    vectors = rng.standard_normal((count, dims)).astype(np.float32)
    texts = [f"{source} {revision} passage {i} of {count}" for i in range(count)]
    stored = StoredSource(source, revision, "", {}, "0" * 64, f"{revision}-fp", count)
    chunks = [
        StoredChunk(f"{source}-{i}", i, texts[i], Location(start_line=i + 1), vectors[i])
        for i in range(count)
    ]
    return stored, chunks


def _race(
    source: str, writes: list[dict[str, Any]], index: Callable[[str, str, list[str]], Any]
) -> tuple[threading.Event, Callable[[], list[Any]]]:
    """Writer threads held at a gate; returns the gate and a function that collects outcomes."""
    gate = threading.Event()
    results: list[Any] = []
    lock = threading.Lock()

    def writer(revision: str, texts: list[str]) -> None:
        gate.wait(timeout=60)
        outcome = index(source, revision, texts)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=writer, args=(w["revision"], w["texts"])) for w in writes]
    for t in threads:
        t.start()

    def collect() -> list[Any]:
        for t in threads:
            t.join(timeout=120)
        return results

    return gate, collect


def main() -> None:  # pragma: no cover - runs in the replica process
    from retrieval_host.adapters.embedding_local import LocalEmbedding
    from retrieval_host.adapters.postgres import PgVectorStore
    from retrieval_host.core.service import Corpus, RetrievalService

    name = os.environ["RH_REPLICA_NAME"]
    dsn = make_conninfo(os.environ["RH_REPLICA_DSN"], application_name=name)
    store = PgVectorStore.open(dsn, schema=os.environ["RH_REPLICA_SCHEMA"], pool_size=6)
    authorizer = _Authorizer()
    embedding = LocalEmbedding(threads=1)
    service = RetrievalService([Corpus(CORPUS, "passages-v1", embedding, store, authorizer)])
    dims = embedding.descriptor.dimensions

    def say(body: Mapping[str, Any]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    def index(source: str, revision: str, texts: list[str]) -> dict[str, Any]:
        try:
            result = service.index_context(
                _index_request(source, revision, texts), RequestContext(subject=name)
            )
        except RetrievalError as exc:
            return _error(exc) | {"revision": revision}
        return {
            "ok": True,
            "revision": revision,
            "status": result.status,
            "replaced": result.replaced_revision,
        }

    def search(grant: dict[str, str], query: str, limit: int) -> dict[str, Any]:
        authorizer.search = grant
        try:
            result = service.search_context(
                SearchRequest(CORPUS, query, limit=limit), RequestContext(subject=name)
            )
        except RetrievalError as exc:
            return _error(exc)
        hits = [
            {"chunkId": h.chunk_id, "source": h.source.id, "revision": h.source.revision}
            | {"text": h.text}
            for h in result.hits
        ]
        return {"ok": True, "hits": hits}

    def replace_big(command: dict[str, Any]) -> dict[str, Any]:
        source, chunks = _synthetic(command["source"], command["revision"], command["count"], dims)
        try:
            store.replace_source(
                CORPUS,
                NAMESPACE,
                source,
                chunks,
                expected_revision=command.get("expected"),
                limits=CapacityLimits(),
            )
        except RetrievalError as exc:
            return _error(exc)
        return {"ok": True}

    say({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "exit":
            break
        if op == "index":
            say(index(command["source"], command["revision"], command["texts"]))
        elif op == "search":
            say(search(dict(command["grant"]), command["query"], command.get("limit", 8)))
        elif op == "race":
            gate, collect = _race(command["source"], command["writes"], index)
            say({"ok": True, "armed": len(command["writes"])})
            if json.loads(sys.stdin.readline())["op"] != "go":
                raise SystemExit("expected go")
            gate.set()
            say({"ok": True, "results": collect()})
        elif op == "replace_big":
            say(replace_big(command))
        else:
            say({"ok": False, "code": "UNKNOWN_OP"})
    store.close()


class ReplicaProcess:
    """The test side of one replica process."""

    def __init__(self, name: str, dsn: str, schema: str, *, ready_timeout_s: float = 60.0) -> None:
        env = dict(os.environ)
        env.update(RH_REPLICA_DSN=dsn, RH_REPLICA_SCHEMA=schema, RH_REPLICA_NAME=name)
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.pg_replica"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._ready_timeout = ready_timeout_s
        self.pid: int | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self) -> None:
        """Block until the replica printed its ready line (bounded)."""
        body = self.receive(self._ready_timeout)
        if not body.get("ready"):
            raise AssertionError(f"{self.name} did not become ready: {body}")
        self.pid = int(body["pid"])

    def send(self, body: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout_s: float = 60.0) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{self.name} gave no answer within {timeout_s} s") from None
        if line is None:
            raise AssertionError(f"{self.name} exited (code {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, body: Mapping[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        self.send(body)
        return self.receive(timeout_s)

    def close(self) -> None:
        """Ask the process to exit; kill it if it does not within a few seconds."""
        if self.proc.poll() is None:
            try:
                self.send({"op": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


if __name__ == "__main__":  # pragma: no cover
    main()

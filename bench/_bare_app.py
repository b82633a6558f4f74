"""Bare uvicorn endpoints for the HTTP benchmark's overhead baseline (run as a subprocess).

    python -m bench._bare_app static --body FILE --port P --cert C --key K
    python -m bench._bare_app search --store DB --queries NPY --grants JSON --subject S ...

`static` answers every request with the same prepared JSON (what serving costs at all).
`search` does the work a search needs and nothing else: parse the JSON body, look up the
query vector, `SqliteVectorStore.search` over the same store with the same allowed sources
in a worker thread, and render the same JSON as the host (same fields, same hits). No
authentication, validation, middleware, authorization re-check or framework: the host's
overhead is measured against it. Both are raw ASGI apps served by uvicorn over TLS with the
same certificate, uvloop and httptools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from bench._common import CORPUS, NAMESPACE, REVISION, descriptor
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.ports import Candidate
from retrieval_host.serving.workers import reuse_port_socket

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def static_app(payload: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _body(receive)
        await _answer(send, payload)

    return app


def render(candidates: list[Candidate], limit: int) -> bytes:
    """The host's search response for these candidates (same fields, camelCase)."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    scope = {"corpus": CORPUS, "indexVersion": "bench-v1", "namespace": NAMESPACE}
    hits = [
        {
            "chunkId": c.chunk_id,
            "source": {"id": c.source_id, "revision": c.revision},
            "location": {
                "page": c.location.page,
                "startLine": c.location.start_line,
                "endLine": c.location.end_line,
                "documentId": c.location.document_id,
            },
            "text": c.text,
            "documentSha256": c.document_sha256,
            "score": c.score,
            "retrievedAt": now,
            "scope": scope,
            "scores": {"dense": c.score},
            "metadata": c.metadata,
            # The host reads its hits' commit times with one more statement; null here.
            "indexedAt": None,
        }
        for c in candidates[:limit]
    ]
    body = {
        "hits": hits,
        "truncated": len(candidates) > limit,
        "retrievedAt": now,
        "scope": scope,
        "usage": {"embedding": {"requests": 1, "inputTokens": 1}},
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def search_app(
    store: SqliteVectorStore, queries: np.ndarray[Any, Any], allowed: dict[str, str]
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    pool = ThreadPoolExecutor(16)

    def work(query: str, limit: int) -> bytes:
        vector = queries[int(query[1:])]
        candidates = store.search(CORPUS, NAMESPACE, allowed, vector, limit + 1, CancelToken())
        return render(candidates, limit)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = json.loads(await _body(receive))
        loop = asyncio.get_running_loop()
        payload = await loop.run_in_executor(
            pool, work, request["query"], int(request.get("limit", 8))
        )
        await _answer(send, payload)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["static", "search"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--body", type=Path)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--grants", type=Path)
    parser.add_argument("--subject", default="tenth")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workers > 1 and not args.worker:
        sys.exit(_supervise(args.port, args.workers))
    app: Callable[[Scope, Receive, Send], Awaitable[None]]
    if args.mode == "static":
        app = static_app(args.body.read_bytes())
    else:
        store = SqliteVectorStore.open(args.store)
        store.open_corpus(descriptor())
        allowed = {sid: REVISION for sid in json.loads(args.grants.read_text())[args.subject]}
        app = search_app(store, np.load(args.queries).astype(np.float32), allowed)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        ssl_certfile=str(args.cert),
        ssl_keyfile=str(args.key),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    sockets = [reuse_port_socket("127.0.0.1", args.port)] if args.worker else None
    uvicorn.Server(config).run(sockets=sockets)


def _supervise(port: int, workers: int) -> int:
    """The same process model as the host's `listen.workers`: `workers` processes of this
    script, each listening on the port with SO_REUSEPORT (the port reserved here)."""
    reserved = reuse_port_socket("127.0.0.1", port)
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench._bare_app", *sys.argv[1:], "--worker"],
            start_new_session=True,
        )
        for _ in range(workers)
    ]

    def stop(sig: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = max(child.wait() for child in children)
    reserved.close()
    return code


if __name__ == "__main__":
    main()

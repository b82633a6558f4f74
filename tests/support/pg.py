"""A real PostgreSQL + pgvector for tests, started on loopback by `scripts/pg` (once per session).

With `RETRIEVAL_HOST_TEST_PG_DSN` set, that server is used instead and nothing is started;
schemas created through `schema_for`/`new_schema` are dropped at the end either way.

Use the `pg_dsn` session fixture (import it into a conftest), or `shared_dsn()` where a fixture
cannot be requested; `stop_shared_server()` stops it (the fixture does so at session end, and an
atexit hook is the fallback).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.ports import free_port

ENV_DSN = "RETRIEVAL_HOST_TEST_PG_DSN"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "pg"
START_TIMEOUT_S = 120.0


@dataclass
class PgServer:
    """A server the tests use: private (started here, `root` set) or external."""

    dsn: str
    root: Path | None = None
    schemas: set[str] = field(default_factory=set)

    @property
    def data_dir(self) -> Path | None:
        return None if self.root is None else self.root / "data"

    def stop(self) -> None:
        """Drop the schemas tests created; stop and delete a private server."""
        if self.root is None:
            with contextlib.suppress(psycopg.Error), connect(self.dsn) as conn:
                for schema in sorted(self.schemas):
                    conn.execute(
                        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                    )
            self.schemas.clear()
            return
        subprocess.run(
            [str(SCRIPT), "stop", str(self.data_dir)], check=True, timeout=90, capture_output=True
        )
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection for test assertions (fails fast: 5 s connect timeout)."""
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def wait_ready(dsn: str, timeout_s: float = 30.0) -> None:
    """Poll until the server accepts a connection and answers a query (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with connect(dsn) as conn:
                conn.execute("SELECT 1").fetchone()
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_private_server() -> PgServer:
    """`scripts/pg install`, then start a server in a fresh directory on a free port."""
    subprocess.run([str(SCRIPT), "install"], check=True, timeout=600, capture_output=True)
    # The server runs as the `pgvec` user: its directory chain must be traversable by it.
    root = Path(tempfile.mkdtemp(prefix="rh-pg-", dir="/tmp"))
    root.chmod(0o711)
    server = PgServer("", root)
    try:
        last = ""
        for _ in range(3):  # a free port can be taken between the probe and the start
            done = subprocess.run(
                [str(SCRIPT), "start", str(server.data_dir), str(free_port())],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
            if done.returncode == 0:
                server.dsn = done.stdout.strip()
                break
            last = done.stderr
        else:
            raise RuntimeError(f"scripts/pg start failed: {last}")
        wait_ready(server.dsn)
        with connect(server.dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except BaseException:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server


_SHARED: PgServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_server() -> PgServer:
    """The session's server, started on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            external = os.environ.get(ENV_DSN)
            if external:
                wait_ready(external)
                _SHARED = PgServer(external)
            else:
                _SHARED = start_private_server()
            atexit.register(stop_shared_server)
        return _SHARED


def shared_dsn() -> str:
    """The DSN of the session's server, started on first use."""
    return shared_server().dsn


def stop_shared_server() -> None:
    """Stop the session's server (and drop test schemas). Idempotent."""
    global _SHARED
    with _SHARED_LOCK:
        server, _SHARED = _SHARED, None
    if server is not None:
        server.stop()


def new_schema(prefix: str = "t") -> str:
    """A fresh schema name, remembered so that it is dropped at the end of the session."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    shared_server().schemas.add(name)
    return name


def schema_for(location: Path) -> str:
    """A schema name of its own for a test directory (the same directory, the same schema)."""
    name = "t_" + hashlib.sha256(str(location).encode()).hexdigest()[:20]
    shared_server().schemas.add(name)
    return name


def drop_schema(dsn: str, schema: str) -> None:
    with connect(dsn) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def vector_store_version(dsn: str, schema: str) -> int:
    """The `vector-store` version `schema` records (what its migration tests check)."""
    with connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT version FROM {}.schema_version WHERE component = %s").format(
                sql.Identifier(schema)
            ),
            ("vector-store",),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of a real PostgreSQL with pgvector on loopback, for the whole session."""
    yield shared_dsn()
    stop_shared_server()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name of its own for one test, dropped afterwards."""
    name = new_schema()
    yield name
    drop_schema(pg_dsn, name)


@pytest.fixture(scope="session", autouse=True)
def pg_server_session() -> Iterator[None]:
    """For a conftest whose code calls `shared_dsn()` lazily: stops the server at session end.

    Import it into that conftest; it starts nothing by itself.
    """
    yield
    stop_shared_server()

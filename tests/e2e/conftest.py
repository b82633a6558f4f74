"""Fixtures of the HTTPS host tests (`test_host_*.py`): one real host over TLS per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.host import RunningHost, World, build_world, serve_in_thread

# Small limits so the tests reach them quickly (the defaults are for production). The header
# and body deadlines are long here: a TLS handshake and a 100 KB head sent at once missed a
# 1 s deadline on a loaded machine (SSLEOFError in six hardening tests under load); the tests
# of the deadlines themselves use `deadline_host`.
HOST_LIMITS = {
    "maxBodyBytes": 256 * 1024,
    "maxJsonBodyBytes": 128 * 1024,
    "maxConcurrency": 2,
    "headerTimeoutS": 30.0,
    "bodyTimeoutS": 30.0,
}
DEADLINE_LIMITS = {**HOST_LIMITS, "headerTimeoutS": 1.0, "bodyTimeoutS": 2.0}
ALLOWED_ORIGIN = "https://app.example"


@pytest.fixture(scope="session")
def host_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("host-world"), local_embedding)
    yield world
    world.close()


@pytest.fixture(scope="session")
def running_host(host_world: World) -> Iterator[RunningHost]:
    settings = host_world.settings(limits=HOST_LIMITS, allowedOrigins=[ALLOWED_ORIGIN])
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        yield host


@pytest.fixture(scope="session")
def deadline_host(host_world: World) -> Iterator[RunningHost]:
    """The same host with short header and body deadlines, for the tests that wait them out."""
    settings = host_world.settings(limits=DEADLINE_LIMITS, allowedOrigins=[ALLOWED_ORIGIN])
    with serve_in_thread(settings, host_world.driver, host_world.tls) as host:
        yield host

"""Fixtures of the HTTPS host tests (`test_host_*.py`): one real host over TLS per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.host import RunningHost, World, build_world, serve_in_thread

# Small limits so the tests reach them quickly (the defaults are for production).
HOST_LIMITS = {
    "maxBodyBytes": 256 * 1024,
    "maxJsonBodyBytes": 128 * 1024,
    "maxConcurrency": 2,
    "headerTimeoutS": 1.0,
    "bodyTimeoutS": 2.0,
}
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

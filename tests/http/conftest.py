"""Fixtures of the in-process ASGI tests of the host (httpx.ASGITransport, no server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.host import World, build_world


@pytest.fixture(scope="module")
def http_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("http-world"), local_embedding)
    yield world
    world.close()

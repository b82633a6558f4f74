"""Fixtures of the client tests: one real host over TLS (custom CA) per session, and one
parametrised fixture that runs each test with the sync `Client` and with the `AsyncClient`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pytest
from anyio.from_thread import start_blocking_portal

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.adapters.provider_openai import OpenAIChatProvider
from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.runs import RunEngine
from retrieval_host.driver import Driver
from retrieval_host_client import AsyncClient, Client
from tests.client.modes import ClientApi, PortalClient
from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.host import TOKENS, RunningHost, World, build_world, serve_in_thread

# `extractive` answers offline; `chat` is the real OpenAI-compatible adapter talking to the
# loopback fake, which can stall mid-stream (to cancel a run while the provider streams).
PROVIDERS = ("extractive", "chat")
CHAT_MODEL = "gpt-4o-mini"
HEARTBEAT_S = 0.05
HOST_LIMITS = {
    "maxBodyBytes": 256 * 1024,
    "maxConcurrency": 4,
    "headerTimeoutS": 5.0,
    "bodyTimeoutS": 10.0,
}


class Connect(Protocol):
    def __call__(self, token: str | None = "admin", **options: Any) -> ClientApi: ...


@pytest.fixture(scope="session")
def client_world(
    tmp_path_factory: pytest.TempPathFactory, local_embedding: LocalEmbedding
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("client-world"), local_embedding)
    yield world
    world.close()


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="session")
def client_host(client_world: World, fake_openai: FakeOpenAI) -> Iterator[RunningHost]:
    chat = OpenAIChatProvider(base_url=fake_openai.base_url, api_key=lambda: DEFAULT_API_KEY)
    runs = SqliteRunStore.open(client_world.directory / "store" / "runs.sqlite")
    driver = Driver(
        client_world.driver.retrieval,
        runs=RunEngine(
            client_world.driver.retrieval,
            {"extractive": ExtractiveProvider(), "chat": chat},
            runs,
        ),
    )
    # Every token may use both providers, except bob's (the refused-before-start case).
    tokens = [
        {**entry, "providers": [] if name == "bob" else list(PROVIDERS)}
        for name, entry in zip(TOKENS, client_world.token_entries, strict=True)
    ]
    settings = client_world.settings(
        limits=HOST_LIMITS, tokens=tokens, runs={"heartbeatS": HEARTBEAT_S}
    )
    try:
        with serve_in_thread(settings, driver, client_world.tls) as host:
            yield host
    finally:
        chat.close()
        runs.close()


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connect(mode: str, client_host: RunningHost, client_world: World) -> Iterator[Connect]:
    """`connect(token_name, **options)`: a client of the session host in this test's mode.

    `token` names a token of the world (None: no token; `token_value=` gives a literal one);
    other options go to the client as they are (`base_url=` replaces the host's address)."""
    opened: list[ClientApi] = []
    with start_blocking_portal("asyncio") as portal:

        def make(token: str | None = "admin", **options: Any) -> ClientApi:
            base_url = options.pop("base_url", client_host.base_url)
            options.setdefault("ca_bundle", client_world.tls.ca_file)
            value = options.pop("token_value", client_world.tokens[token] if token else None)
            options["token"] = value
            api: ClientApi
            if mode == "sync":
                api = Client(base_url, **options)
            else:
                api = PortalClient(portal, AsyncClient(base_url, **options))
            opened.append(api)
            return api

        yield make
        for api in opened:
            api.close()


@pytest.fixture
def api(connect: Connect) -> ClientApi:
    """A client of the session host with the `admin` token (every `library` source)."""
    return connect()

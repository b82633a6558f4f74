"""Fixtures of the hosted adapters' tests: the fake OpenAI-compatible server
(`tests.support.fake_openai`) and chat providers built against it.

A module whose tests need another server (one per module, or over TLS too) or another adapter
defines its own `server` or `make`, which then takes the place of these.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrieval_host.adapters.provider_openai import OpenAIChatProvider
from tests.support.adapter_factory import ChatFactory, closing_factory
from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    """A fake server of the test's own, with nothing recorded or scripted."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def make(server: FakeOpenAI) -> Iterator[ChatFactory]:
    """`make(**overrides)`: an `OpenAIChatProvider` for `server` with its key, unless the
    overrides say otherwise; all are closed after the test."""
    with closing_factory(
        OpenAIChatProvider, base_url=server.base_url, api_key=lambda: DEFAULT_API_KEY
    ) as factory:
        yield factory

"""Adapters built for one test and closed after it, from defaults a test may override.

The hosted adapters' tests (`tests/adapters/`) build several clients per test, each against the
fake server with a key, some with another timeout, key or address; every one holds an HTTP pool
that must be closed. `closing_factory` is that factory once, for every adapter class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

from retrieval_host.adapters.provider_openai import OpenAIChatProvider


class _Closable(Protocol):
    def close(self) -> None: ...


A = TypeVar("A", bound=_Closable)

ChatFactory = Callable[..., OpenAIChatProvider]


@contextmanager
def closing_factory(build: Callable[..., A], **defaults: object) -> Iterator[Callable[..., A]]:
    """A factory that calls `build` with `defaults` updated by its own keyword arguments; every
    adapter it built is closed when the block ends."""
    made: list[A] = []

    def factory(**overrides: object) -> A:
        adapter = build(**{**defaults, **overrides})
        made.append(adapter)
        return adapter

    try:
        yield factory
    finally:
        for adapter in made:
            adapter.close()

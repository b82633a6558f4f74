"""Grounded runs on a `tests.support.host.World`, in process: a run engine over the world's
retrieval service, a SQLite run store, and one token granted the world's corpus and providers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from retrieval_host.adapters.sqlite import SqliteRunStore
from retrieval_host.core.run_ports import GenerationProvider
from retrieval_host.core.runs import RunEngine
from retrieval_host.driver import Driver
from retrieval_host.serving.tokens import new_token, token_config_entry
from tests.support.host import CORPUS, World

RUNNER = "runner"  # the token's name in `world.tokens`; its subject is the world's `admin`


def add_runs(
    world: World, directory: Path, providers: Mapping[str, GenerationProvider]
) -> Callable[[], None]:
    """Give `world` a run engine with `providers` and a `runner` token that may use them and
    search, index and delete in `CORPUS`. Returns the function that closes the run store."""
    runs = SqliteRunStore.open(directory / "runs.db")
    engine = RunEngine(world.driver.retrieval, providers, runs)
    world.driver = Driver(world.driver.retrieval, runs=engine)
    world.tokens[RUNNER] = new_token()
    world.token_entries.append(
        token_config_entry(
            world.tokens[RUNNER],
            "admin",
            search=[CORPUS],
            index=[CORPUS],
            delete=[CORPUS],
            providers=list(providers),
        )
    )
    return runs.close

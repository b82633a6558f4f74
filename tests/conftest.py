"""Fixtures every test directory shares: the real local model, loaded once per session, the
in-process run engine world, and asyncio as the one anyio backend.

Fixtures of one directory stay in that directory's conftest; a host served over TLS is built with
`tests.support.host` (`build_world` and `serve_in_thread`), the one harness for real servers.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from retrieval_host.adapters.embedding_local import LocalEmbedding
from tests.support.run_engine import RunWorld, open_run_world

# No per-example deadline: Hypothesis's default (200 ms) is a timing assertion, and one example
# of a cursor round trip took 280 ms on a machine whose cores ran 8 busy loops (session 40:
# `FlakyFailure`, passing again at 0.15 ms). What a property checks is what it computes.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(scope="session", autouse=True)
def temporary_files_under_pytest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary file of the session and of the processes it starts (TMPDIR) goes under
    pytest's base directory, which pytest rotates: a host or writer that a test kills with
    SIGKILL cannot remove its own (multiprocessing's `pymp-*` directory, with the parse
    workers' forkserver socket, stayed in /tmp, ~3 per run)."""
    base = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(base))
        patch.setattr(tempfile, "tempdir", None)  # recomputed from TMPDIR on next use
        yield base


@pytest.fixture(scope="session")
def local_embedding() -> LocalEmbedding:
    """The real local model, loaded once (about a second) and shared read-only.

    One intra-op thread: the suite runs beside other work, and inference is not what it measures.
    A test that needs its own instance (another batch size, tampered weights) constructs one.
    """
    return LocalEmbedding(threads=1)


@pytest.fixture
def anyio_backend() -> str:
    """Tests marked `anyio` run on asyncio, the loop the host serves on."""
    return "asyncio"


@pytest.fixture
def run_world(tmp_path: Path, local_embedding: LocalEmbedding) -> Iterator[RunWorld]:
    """A run engine over three indexed documents, in a private directory (`run_engine.py`)."""
    with open_run_world(tmp_path, local_embedding) as world:
        yield world


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may enter (0755) in /tmp (sticky, root's): pytest's own are
    0700, below which nothing is within other users' reach (`retrieval_host.access_files`)."""
    made = Path(tempfile.mkdtemp(prefix="rh-open-", dir="/tmp"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        for below in made.rglob("*"):
            if below.is_dir() and not below.is_symlink():
                below.chmod(0o700)
        shutil.rmtree(made)

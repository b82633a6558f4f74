"""A parse worker runs the code its pool started with, and one that cannot start is the host's
failure, not the document's.

Probe I, session 42: a new release written into the venv under a running host (deploy/README,
"Upgrading", step 2) made each new worker re-run the host's `__main__` from disk, which failed
at import on a mix of old and new modules; every later ingest was answered `422
DOCUMENT_TOO_COMPLEX` / `parser-exited` until a restart. These run a real pool (real fork
server) in a host process from a copy of the package (`pool_host_child.py`) and change that
copy on disk while it runs, as the probe did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import retrieval_host
from retrieval_host.ingest.isolation import counter_recipe
from tests.support.observability import host_process

CHILD = Path(__file__).with_name("pool_host_child.py")


class PoolHost:
    """The child process: one command a line in, one JSON answer a line out."""

    def __init__(self, package_root: Path, cwd: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(package_root))
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            _, stderr = self.process.communicate(timeout=60)
            pytest.fail(f"the pool's host process ended: {stderr[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        self.process.communicate(timeout=60)  # end of stdin: it closes its pool and exits


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the package (as a venv holds it), changed on disk by the tests."""
    source = Path(retrieval_host.__file__).parent
    copy = tmp_path / "site" / "retrieval_host"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture
def host(package: Path, tmp_path: Path) -> Iterator[PoolHost]:
    h = PoolHost(package.parent, tmp_path)
    try:
        yield h
    finally:
        h.stop()


def write_release_two(package: Path) -> None:
    """A consistent next release, as the probe wrote it: a class added to a core module and
    imported by an adapter (importable on its own; not next to the old core module), and a
    parser module that a fresh import of the worker would now fail on."""
    with (package / "core" / "run_ports.py").open("a", encoding="utf-8") as module:
        module.write("\n\nclass ReleaseTwoEvent:\n    pass\n")
    adapter = package / "adapters" / "provider_extractive.py"
    text = adapter.read_text(encoding="utf-8")
    future = "from __future__ import annotations\n"
    assert future in text
    adapter.write_text(
        text.replace(
            future, future + "\nfrom retrieval_host.core.run_ports import ReleaseTwoEvent\n", 1
        ),
        encoding="utf-8",
    )
    write_half_written_parser(package)


def write_half_written_parser(package: Path) -> None:
    with (package / "ingest" / "markdown.py").open("a", encoding="utf-8") as module:
        module.write('\n\nraise ImportError("release 2 is half written")\n')


def test_a_worker_started_after_the_package_changed_on_disk_runs_the_code_of_its_pool(
    host: PoolHost, package: Path
) -> None:
    assert host.ask("parse")["ok"]
    write_release_two(package)
    second = host.ask("parse")  # a new worker: the first retired after its document
    assert second["ok"], second
    assert "east quay" in second["text"]
    assert second["counters"]["started"] == 2


def test_a_pool_started_at_host_start_parses_with_that_code_after_an_upgrade_on_disk(
    host: PoolHost, package: Path
) -> None:
    started = host.ask("start")
    assert started["ok"], started
    write_release_two(package)
    answers = [host.ask("parse"), host.ask("parse")]
    assert [answer["ok"] for answer in answers] == [True, True], answers
    assert answers[-1]["counters"]["started"] == 2


def test_a_worker_that_cannot_start_is_the_hosts_503_not_the_documents_422(
    host: PoolHost, package: Path
) -> None:
    assert host.ask("parse")["ok"]
    # The fork server dies (the OOM killer) after the package changed on disk: the next one
    # cannot load the worker, and no worker starts.
    write_half_written_parser(package)
    assert host.ask("kill-fork-server")["ok"]
    refused = host.ask("parse")
    assert (refused.get("code"), refused.get("reason")) == (
        "HOST_BUSY",
        "parse-worker-unavailable",
    ), refused
    assert refused["counters"]["start_failures"] == 1
    [log] = [r for r in refused["logs"] if r["message"] == "a parse worker could not start"]
    assert log["logger"] == "retrieval_host.ingest.isolation"
    assert "before it started" in log["error"]


class ScriptRecipe:
    def build(self) -> Any:
        raise AssertionError("not built in the host")


class ScriptEmbedding:
    def portable_token_counter(self) -> ScriptRecipe:
        return ScriptRecipe()


def test_a_counter_recipe_defined_in_a_script_is_not_sent_to_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker never runs the host's `__main__`, so it could not rebuild the recipe: the host
    # cuts the text itself instead.
    assert counter_recipe(ScriptEmbedding()) is not None
    monkeypatch.setattr(ScriptRecipe, "__module__", "__main__")
    assert counter_recipe(ScriptEmbedding()) is None


def _children(pid: int) -> list[str]:
    """The command lines of the processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # it ended meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(cmdline)
    return found


def test_a_served_host_starts_its_parse_workers_fork_server_before_any_ingest(
    tmp_path: Path,
) -> None:
    """`retrieval-host serve` starts the fork server as it starts (`serving.server.
    start_parsers`): started at the first ingest, it loaded whatever code was on disk then."""
    with host_process(tmp_path / "host", subjects={"alice": []}) as host:
        deadline = time.monotonic() + 120
        while not any("forkserver" in c for c in _children(host.process.pid)):
            assert time.monotonic() < deadline, "no fork server started without an ingest"
            host.process.poll()
            assert host.process.returncode is None, host.log_text()[-3000:]
            time.sleep(0.05)

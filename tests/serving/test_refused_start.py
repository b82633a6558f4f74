"""A start that refuses changes nothing: opening the stores migrates an earlier release's
schema (that release then refuses them, `UNSAFE_STORE`), so every check that can refuse a start
comes before the stores are opened (probe U: a port in use, an ACL key this release does not
know and a read-only store of an earlier schema were each refused after both stores had been
migrated, and a rollback to the release that wrote them no longer started)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging.config
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import trustme

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.serving.cli import main
from retrieval_host.serving.factory import build_driver, close_driver
from retrieval_host.serving.server import check_listeners
from retrieval_host.serving.workers import WorkerSeat
from retrieval_host.settings import SettingsError, load_settings
from tests.support.previous_vector_store import sqlite_v2_database
from tests.support.run_records import SQLITE_RUNS_SCHEMA_V3, old_database

REPO = Path(__file__).resolve().parents[2]
ACL = {"subjects": {"alice": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}


@pytest.fixture
def earlier_state(
    tmp_path: Path, local_embedding: LocalEmbedding, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, dict[str, Any]]:
    """A host file and the stores an earlier release left: the vector store at schema version
    2 holding a passage, the run records at version 3 (a provider is configured, so the
    example application opens them). Returns the config path and its settings as a dict."""
    # `serve` configures logging for the process (handlers on pytest's capture, closed after
    # the test); only the printed error line is read here.
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: None)
    leaf = trustme.CA().issue_cert("127.0.0.1")
    (tmp_path / "tls").mkdir()
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls" / "server.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls" / "server-key.pem"))
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    store = tmp_path / "state" / "store"
    store.mkdir(mode=0o700, parents=True)
    (tmp_path / "state").chmod(0o700)
    described = CorpusDescriptor(
        "library", "passages-v1", local_embedding.descriptor, ChunkingSettings().as_identity()
    )
    sqlite_v2_database(
        store / "retrieval.sqlite", described, {("docs", "old"): ["An old passage."]}
    )
    old_database(store / "runs.db", SQLITE_RUNS_SCHEMA_V3, 3)
    host = json.loads((REPO / "config" / "host.example.json").read_text())
    host.update(
        listen={"host": "127.0.0.1", "port": 0, "workers": 1},
        providers={"local": {"kind": "extractive"}},
        store={"sqlitePath": str(store / "retrieval.sqlite")},
        applicationOptions={"aclFile": "acl.json", "corpora": ["library"]},
    )
    return tmp_path / "host.json", host


def _files(directory: Path) -> dict[str, str]:
    """Every file under `directory` (the stores and any -wal/-shm beside them) by content."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _versions(store: Path) -> list[int]:
    versions = []
    for name in ("retrieval.sqlite", "runs.db"):
        db = apsw.Connection(str(store / name), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            [(version,)] = db.execute("PRAGMA user_version").fetchall()
            assert isinstance(version, int)
            versions.append(version)
        finally:
            db.close()
    return versions


def _held_port(stack: contextlib.ExitStack) -> int:
    """A port on 127.0.0.1 that another process serves for as long as `stack` is open."""
    squatter = stack.enter_context(socket.socket())
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port: int = squatter.getsockname()[1]
    return port


def _port_in_use(host: dict[str, Any], config: Path, stack: contextlib.ExitStack) -> str:
    port = _held_port(stack)  # an earlier host, still serving the store
    host["listen"]["port"] = port
    return f"cannot listen on 127.0.0.1:{port}: Address already in use"


def _metrics_port_in_use(host: dict[str, Any], config: Path, stack: contextlib.ExitStack) -> str:
    port = _held_port(stack)
    host["metrics"] = {"port": port}
    return f"cannot serve metrics on 127.0.0.1:{port} (metrics.port): Address already in use"


def _second_worker_s_metrics_port_in_use(
    host: dict[str, Any], config: Path, stack: contextlib.ExitStack
) -> str:
    # Worker 0 opens (and migrates) the stores: worker 1's port is checked before it starts.
    while True:
        port = _held_port(stack)
        try:
            with socket.socket() as free:
                free.bind(("127.0.0.1", port - 1))
        except OSError:
            continue  # taken: hold another
        break
    host["listen"]["workers"] = 2
    host["metrics"] = {"port": port - 1}
    return f"cannot serve metrics on 127.0.0.1:{port} (metrics.port + 1, worker 1's)"


def _acl_with_an_unknown_key(
    host: dict[str, Any], config: Path, stack: contextlib.ExitStack
) -> str:
    # The file as the earlier release served it: it ignored a "comment" key.
    (config.parent / "acl.json").write_text(json.dumps({**ACL, "comment": "kept by ops"}))
    return "unknown key 'comment'"


def _provider_key_not_set(host: dict[str, Any], config: Path, stack: contextlib.ExitStack) -> str:
    host["providers"]["hosted"] = {
        "kind": "openai",
        "baseUrl": "https://llm.example/v1",
        "apiKey": {"env": "HOSTED_LLM_KEY"},
    }
    return "environment variable HOSTED_LLM_KEY is not set"


def _reranker_without_a_model(
    host: dict[str, Any], config: Path, stack: contextlib.ExitStack
) -> str:
    host["applicationOptions"]["reranker"] = {"baseUrl": "https://rerank.example"}
    return "applicationOptions.reranker.model: Field required"


def _read_only_store(host: dict[str, Any], config: Path, stack: contextlib.ExitStack) -> str:
    # The vector store refuses to be read at an earlier schema; the run records, which a
    # read-only host still writes, must not have been migrated before it said so.
    host["store"]["readOnly"] = True
    return "STORE_READ_ONLY: a store opened read-only must be of schema version"


def _another_index_version(host: dict[str, Any], config: Path, stack: contextlib.ExitStack) -> str:
    # The stored corpus was built as passages-v1: found when the corpus is opened, which came
    # after both stores were migrated.
    host["applicationOptions"]["indexVersion"] = "passages-v2"
    return (
        "DESCRIPTOR_MISMATCH: corpus 'library' was built with a different descriptor; "
        "differing fields: index_version"
    )


def _set_in_vector_store(config: Path, pragma: str) -> None:
    db = apsw.Connection(str(config.parent / "state" / "store" / "retrieval.sqlite"))
    try:
        db.execute(f"PRAGMA {pragma}")
    finally:
        db.close()


def _a_newer_release_s_vector_store(
    host: dict[str, Any], config: Path, stack: contextlib.ExitStack
) -> str:
    # A later release's vector store beside the earlier run records (a half-done rollback):
    # the vector store refused after the run records were migrated.
    _set_in_vector_store(config, "user_version = 99")
    return "UNSAFE_STORE: the store has schema version 99"


def _another_application_s_database(
    host: dict[str, Any], config: Path, stack: contextlib.ExitStack
) -> str:
    _set_in_vector_store(config, "application_id = 1234")
    return "UNSAFE_STORE: "


Refusal = Callable[[dict[str, Any], Path, contextlib.ExitStack], str]


@pytest.mark.parametrize(
    "refusal",
    [
        _port_in_use,
        _metrics_port_in_use,
        _second_worker_s_metrics_port_in_use,
        _acl_with_an_unknown_key,
        _provider_key_not_set,
        _reranker_without_a_model,
        _read_only_store,
        _another_index_version,
        _a_newer_release_s_vector_store,
        _another_application_s_database,
    ],
)
def test_a_start_that_refuses_leaves_an_earlier_release_s_stores_as_they_were(
    earlier_state: tuple[Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    refusal: Refusal,
) -> None:
    config, host = earlier_state
    store = config.parent / "state" / "store"
    with contextlib.ExitStack() as stack:
        said = refusal(host, config, stack)
        before, versions = _files(store), _versions(store)
        config.write_text(json.dumps(host))
        assert main(["serve", "--config", str(config)], environ={}) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    [line] = [line for line in error.splitlines() if line.startswith("retrieval-host: ")]
    assert said in line
    assert _files(store) == before
    assert _versions(store) == versions
    assert versions[1] == 3  # the run records are still the earlier release's


def test_the_same_state_started_without_a_refusal_is_migrated(
    earlier_state: tuple[Path, dict[str, Any]],
) -> None:
    # What the test above would see if a check came after the stores were opened: this state
    # is one a start changes.
    config, host = earlier_state
    config.write_text(json.dumps(host))
    store = config.parent / "state" / "store"
    before = _files(store)
    close_driver(build_driver(load_settings(config, {}), {}))
    assert _versions(store) != [2, 3]
    assert _files(store) != before


def test_a_worker_checks_its_own_metrics_port_and_not_the_port_its_seat_holds(
    earlier_state: tuple[Path, dict[str, Any]],
) -> None:
    config, host = earlier_state
    with contextlib.ExitStack() as stack:
        serving = _held_port(stack)  # the host's port: the supervisor's, joined by the seat
        host.update(listen={"host": "127.0.0.1", "port": serving, "workers": 2})
        config.write_text(json.dumps(host))
        ours, theirs = stack.enter_context(socket.socket()), stack.enter_context(socket.socket())
        check_listeners(load_settings(config, {}), WorkerSeat(1, ours, theirs))
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{serving}"):
            check_listeners(load_settings(config, {}))  # a single-process host would bind it
        taken = _held_port(stack)  # worker 1's metrics port: metrics.port + 1
        host["metrics"] = {"port": taken - 1}
        config.write_text(json.dumps(host))
        with pytest.raises(SettingsError) as refused:
            check_listeners(load_settings(config, {}), WorkerSeat(1, ours, theirs))
    assert str(refused.value) == (
        f"cannot serve metrics on 127.0.0.1:{taken} (metrics.port + 1, worker 1's): "
        "Address already in use"
    )

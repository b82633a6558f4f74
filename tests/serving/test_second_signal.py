"""A second SIGINT or SIGTERM while the host stops or starts ends it at once, as uvicorn and
gunicorn do on a second Ctrl-C: one line naming the step it did not wait for, exit 130 or 143
(`server.exit_at_once`). Before, the second signal was recorded and ignored: an operator's
second Ctrl-C, or a supervisor's second SIGTERM, waited for a start held by a large store, the
grace period, or a close (signals helper, session 43). Nothing committed is lost, and nothing
of the host is left running."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import threading
from pathlib import Path

import httpx

from retrieval_host.adapters.sqlite import SqliteVectorStore
from tests.support.host import wait_until
from tests.support.observability import CORPUS, NAMESPACE, HostProcess, host_process

# An application factory whose driver holds, until the test says so or for 120 s, one step:
# the start (`open`: the first process to call it, its stores open), a search (`search`:
# a request in flight while the host drains), or the close of the stores (`close`).
HELD_APP = """
import os
import time
from pathlib import Path

from retrieval_host.example_acl import create_driver as example_driver


def _hold(gate, name):
    (gate / name).touch()
    deadline = time.monotonic() + 120
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def create_driver(settings, environ):
    driver = example_driver(settings, environ)
    gate = Path(environ["TEST_GATE_DIR"])
    (gate / f"opened-{os.getpid()}").touch()
    hold = environ["TEST_HOLD"]
    if hold == "open":
        try:
            os.close(os.open(gate / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return driver
        _hold(gate, "opening")
    elif hold == "search":
        search = driver.search_context

        def held_search(*args, **kwargs):
            _hold(gate, "searching")
            return search(*args, **kwargs)

        driver.search_context = held_search
    elif hold == "close":
        close = driver.close

        def held_close():
            _hold(gate, "closing")
            close()

        driver.close = held_close
    return driver
"""

# Well within the 120 s a step is held, so only an exit that did not wait passes.
AT_ONCE_S = 30


def _held_directory(tmp_path: Path) -> tuple[Path, Path]:
    directory, gate = tmp_path / "host", tmp_path / "gate"
    directory.mkdir(mode=0o700)
    gate.mkdir()
    (directory / "held_app.py").write_text(HELD_APP)
    return directory, gate


def _logged(host: HostProcess, start: str) -> bool:
    """Whether a line whose message begins with `start` is on the host's stderr yet."""
    for line in list(host.stderr):
        with contextlib.suppress(ValueError):
            if str(json.loads(line).get("message", "")).startswith(start):
                return True
    return False


def _messages(host: HostProcess) -> list[str]:
    return [str(r["message"]) for r in host.log_records()]


def _left_running(gate: Path) -> list[int]:
    """The processes still running that the host started (they carry the gate in their
    environment): its workers, its parse workers' fork server."""
    marker = f"TEST_GATE_DIR={gate}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(int(entry.name))
    return found


def test_a_second_sigterm_while_the_stores_open_exits_143_at_once(tmp_path: Path) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate), "TEST_HOLD": "open"},
        wait_ready=False,
    ) as host:
        wait_until(lambda: (gate / "opening").exists(), timeout=90, what="the start to be held")
        host.process.send_signal(signal.SIGTERM)
        # The first is said at once, with how not to wait (then the second is a second one).
        wait_until(
            lambda: _logged(host, "received SIGTERM while waiting for the stores to open"),
            timeout=60,
            what="the host to say it heard the first SIGTERM",
        )
        host.process.send_signal(signal.SIGTERM)
        code = host.process.wait(timeout=AT_ONCE_S)
        assert not (gate / "release").exists()  # it did not wait for the step
        assert code == 143, host.log_text()[-4000:]
        messages = _messages(host)
    assert messages[-1] == "second SIGTERM: exiting without waiting for the stores to open"
    assert "stopped; stores closed" not in messages
    assert "Traceback" not in host.log_text()


def test_a_second_sigterm_while_a_request_is_in_flight_exits_143_at_once(
    tmp_path: Path,
) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate), "TEST_HOLD": "search"},
        # A drain of up to 60 s (its cutoff at 55 s): the held search would keep it all along.
        limits={"shutdownGraceS": 60},
    ) as host:
        outcome: list[BaseException | int] = []

        def search() -> None:
            try:
                with host.client("writer") as client:
                    answer = client.post(
                        "/v1/retrieval/search", json={"corpus": CORPUS, "query": "valves"}
                    )
                    outcome.append(answer.status_code)
            except httpx.TransportError as exc:
                outcome.append(exc)

        searching = threading.Thread(target=search)
        searching.start()
        wait_until(lambda: (gate / "searching").exists(), timeout=60, what="a search in flight")
        host.process.send_signal(signal.SIGTERM)
        wait_until(
            lambda: _logged(host, "received SIGTERM"),
            timeout=60,
            what="the host to start draining",
        )
        host.process.send_signal(signal.SIGTERM)
        code = host.process.wait(timeout=AT_ONCE_S)
        searching.join(timeout=60)
        assert code == 143, host.log_text()[-4000:]
        messages = _messages(host)
    assert messages[-1] == (
        "second SIGTERM: exiting without waiting for the requests in flight to end"
    ), messages
    # The search lost its connection: no answer was made up for it.
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
    wait_until(lambda: not _left_running(gate), timeout=30, what="the host's processes to end")


def test_a_second_sigint_while_the_stores_close_exits_130_and_loses_no_commit(
    tmp_path: Path,
) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate), "TEST_HOLD": "close"},
    ) as host:
        with host.client("writer") as client:
            indexed = client.post(
                "/v1/retrieval/index",
                json={
                    "corpus": CORPUS,
                    "source": {"id": "valves", "revision": "r1"},
                    "chunks": [{"id": "v-1", "text": "Close the intake valve first."}],
                },
            )
            assert indexed.status_code == 200, indexed.text
        host.process.send_signal(signal.SIGINT)
        wait_until(lambda: (gate / "closing").exists(), timeout=60, what="the close to be held")
        host.process.send_signal(signal.SIGINT)
        code = host.process.wait(timeout=AT_ONCE_S)
        assert code == 130, host.log_text()[-4000:]
        messages = _messages(host)
    assert messages[-1] == "second SIGINT: exiting without waiting for the stores to close"
    assert "stopped; stores closed" not in messages
    wait_until(lambda: not _left_running(gate), timeout=30, what="the host's processes to end")
    # The store, never closed, opens (its WAL replayed) with the commit the host answered.
    store = SqliteVectorStore.open(host.store_path)
    try:
        stored = store.get_source(CORPUS, NAMESPACE, "valves")
    finally:
        store.close()
    assert stored is not None and stored.revision == "r1"
    with contextlib.closing(sqlite3.connect(host.store_path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_a_second_sigterm_to_the_supervisor_kills_its_workers_and_exits_143(
    tmp_path: Path,
) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        workers=2,
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate), "TEST_HOLD": "open"},
        wait_ready=False,
    ) as host:
        wait_until(lambda: (gate / "opening").exists(), timeout=90, what="a worker to be held")
        wait_until(
            lambda: len(list(gate.glob("opened-*"))) == 2,
            timeout=90,
            what="both workers to open their stores",
        )
        workers = [int(p.name.split("-")[1]) for p in gate.glob("opened-*")]
        host.process.send_signal(signal.SIGTERM)  # forwarded: the held worker waits
        wait_until(
            lambda: _logged(host, "SIGTERM: stopping the workers"),
            timeout=60,
            what="the supervisor to forward the first SIGTERM",
        )
        host.process.send_signal(signal.SIGTERM)
        code = host.process.wait(timeout=AT_ONCE_S)
        assert not (gate / "release").exists()
        assert code == 143, host.log_text()[-4000:]
        records = host.log_records()
    supervisor = [str(r["message"]) for r in records if "worker" not in r]
    assert supervisor[-1] == (
        "second SIGTERM: exiting without waiting for the workers to stop (killed)"
    ), supervisor
    # Killed and reaped by the supervisor before it exited: not even a zombie is left.
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists(), pid
    wait_until(lambda: not _left_running(gate), timeout=30, what="the host's processes to end")

"""SIGTERM while the host starts: it stops cleanly, exit 0, closing what it opened, as the
README's "Operating it" promises for a stop at any time (probe O, session 40: a single host
died of the signal's default action, exit 143 with its stores unclosed; with workers the
supervisor counted a worker ended by the SIGTERM it forwarded as one that died: exit 1, with
no line saying why)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from retrieval_host.serving.workers import supervise
from retrieval_host.settings import load_settings
from tests.support.host import wait_until
from tests.support.observability import host_process
from tests.support.ports import free_port

# An application factory that opens the stores (migrating them, for a new or earlier store),
# then holds the first process to call it until the test says so: a stop comes while the
# host is starting, with its stores open.
HELD_APP = """
import os
import time
from pathlib import Path

from retrieval_host.example_acl import create_driver as example_driver


def create_driver(settings, environ):
    driver = example_driver(settings, environ)
    gate = Path(environ["TEST_GATE_DIR"])
    (gate / f"opened-{os.getpid()}").touch()  # its stores are open
    try:
        os.close(os.open(gate / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return driver
    deadline = time.monotonic() + 120
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return driver
"""


def _held_directory(tmp_path: Path) -> tuple[Path, Path]:
    directory, gate = tmp_path / "host", tmp_path / "gate"
    directory.mkdir(mode=0o700)
    gate.mkdir()
    (directory / "held_app.py").write_text(HELD_APP)
    return directory, gate


def test_a_host_stopped_while_its_stores_open_closes_them_and_exits_0(tmp_path: Path) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate)},
        wait_ready=False,
    ) as host:
        wait_until(lambda: (gate / "held").exists(), timeout=90, what="the start to be held")
        host.process.send_signal(signal.SIGTERM)
        (gate / "release").touch()
        code = host.process.wait(timeout=60)
        assert code == 0, host.log_text()[-4000:]
        messages = [r["message"] for r in host.log_records()]
    assert any(m.startswith("received SIGTERM") for m in messages), messages
    assert messages[-1] == "stopped; stores closed", messages
    assert "Traceback" not in host.log_text()


def test_a_host_with_workers_stopped_while_a_worker_opens_its_stores_exits_0(
    tmp_path: Path,
) -> None:
    directory, gate = _held_directory(tmp_path)
    with host_process(
        directory,
        subjects={"writer": []},
        workers=2,
        application="held_app:create_driver",
        environ={"TEST_GATE_DIR": str(gate)},
        wait_ready=False,
    ) as host:
        wait_until(lambda: (gate / "held").exists(), timeout=90, what="a worker to be held")
        # The other worker too has opened its stores (under load it was still loading when
        # the signal came: stopped while loading, with nothing to close, session 42).
        wait_until(
            lambda: len(list(gate.glob("opened-*"))) == 2,
            timeout=90,
            what="both workers to open their stores",
        )
        host.process.send_signal(signal.SIGTERM)  # forwarded to both workers
        (gate / "release").touch()
        code = host.process.wait(timeout=60)
        assert code == 0, host.log_text()[-4000:]
        records = host.log_records()
    closed = [r["worker"] for r in records if r["message"] == "stopped; stores closed"]
    assert sorted(closed) == [0, 1], records  # each worker closed its stores
    assert not [r for r in records if r["level"] == "error"], records


def test_workers_stopped_while_they_load_are_a_clean_stop(tmp_path: Path) -> None:
    # The SIGTERM reaches the workers while they still load their modules, before any can
    # take it: each ends by the signal (-15), which is the stop the supervisor asked for.
    with host_process(
        tmp_path / "host", subjects={"writer": []}, workers=2, wait_ready=False
    ) as host:
        wait_until(
            lambda: "starting 2 worker processes" in host.log_text(),
            timeout=90,
            what="the supervisor to start its workers",
        )
        host.process.send_signal(signal.SIGTERM)
        code = host.process.wait(timeout=60)
        assert code == 0, host.log_text()[-4000:]
        log = host.log_text()
    assert "exited with" not in log and "Traceback" not in log


def test_a_supervisor_stopped_before_its_workers_start_starts_none(tmp_path: Path) -> None:
    from retrieval_host.serving.server import EarlyStop

    config = tmp_path / "host.json"
    config.write_text(
        json.dumps({"behindProxy": True, "listen": {"port": free_port(), "workers": 2}})
    )
    settings = load_settings(config, {})
    early = EarlyStop()
    early.signal = signal.SIGTERM  # received while the supervisor read its configuration
    previous = signal.getsignal(signal.SIGTERM)
    assert supervise(config, settings, {}, early=early) == 0
    assert signal.getsignal(signal.SIGTERM) is previous  # its forwarding handler is gone

"""The quickstart says `Serving` once its port accepts connections (probe R, session 41: the
line came before the bind, and a script that waited for it and connected was refused)."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from retrieval_host.serving.quickstart import prepare_state
from tests.support.ports import free_port
from tests.support.quickstart import cli


def test_the_serving_line_comes_once_the_port_accepts_connections(tmp_path: Path) -> None:
    port = free_port()
    prepare_state(tmp_path / "state", port)
    process = subprocess.Popen(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:  # ends at exit, so a failed start cannot hang this
            printed.append(line)
            if line.startswith("Serving"):
                # At once, no retry: the line is the promise.
                with socket.create_connection(("127.0.0.1", port), timeout=10):
                    break
        else:
            raise AssertionError("no Serving line:\n" + "".join(printed))
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
            if process.stdout is not None:
                process.stdout.close()

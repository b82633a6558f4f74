"""A quickstart (or `serve`) process for tests: started, awaited until ready, stopped."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.host import wait_until


def cli() -> list[str]:
    script = Path(sys.executable).with_name("retrieval-host")
    return (
        [str(script)] if script.exists() else [sys.executable, "-m", "retrieval_host.serving.cli"]
    )


def ready(ca: Path, port: int) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(ca))
        response = httpx.get(f"https://127.0.0.1:{port}/readyz", verify=context, timeout=2)
    except httpx.TransportError:
        return False
    return response.status_code == 200


@dataclass
class Served:
    """A quickstart process serving, with what it printed so far."""

    process: subprocess.Popen[str]
    lines: list[str]
    errors: list[str]
    code: int | None = None


@contextmanager
def serving(
    command: list[str],
    cwd: Path,
    ca: Path,
    port: int,
    env: dict[str, str] | None = None,
    *,
    announces: bool = True,
) -> Iterator[Served]:
    """Run a quickstart until it prints `Serving` (unless not `announces`: `serve` does not)
    and answers /readyz; stop it (SIGINT) at the end."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    served = Served(process, [], [])
    readers = [
        threading.Thread(target=lambda: served.lines.extend(iter(process.stdout.readline, ""))),  # type: ignore[union-attr]
        threading.Thread(target=lambda: served.errors.extend(iter(process.stderr.readline, ""))),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    try:
        wait_until(
            lambda: (
                not announces
                or any(line.startswith("Serving") for line in served.lines)
                or process.poll() is not None
            ),
            timeout=120,
            what="the quickstart to index and start serving",
        )
        wait_until(
            lambda: process.poll() is not None or ready(ca, port), timeout=120, what="/readyz"
        )
        assert process.poll() is None, "".join(served.lines + served.errors)
        yield served
    finally:
        process.send_signal(signal.SIGINT)
        try:
            served.code = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
            for reader in readers:
                reader.join(timeout=10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()

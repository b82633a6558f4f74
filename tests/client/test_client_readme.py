"""The client README's example is `examples/client_usage.py`, and it runs as written against
the quickstart host (`retrieval-host quickstart`, started as a user would)."""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.host import wait_until
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "client_usage.py"


def test_the_readme_example_is_the_example_file() -> None:
    readme = (ROOT / "sdk_client" / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- snippet: client -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert match is not None
    assert match.group(1) == EXAMPLE.read_text(encoding="utf-8")


def _ready(ca: Path, port: int) -> bool:
    if not ca.exists():
        return False
    try:
        context = ssl.create_default_context(cafile=str(ca))
        response = httpx.get(f"https://127.0.0.1:{port}/readyz", verify=context, timeout=2)
    except (httpx.TransportError, ssl.SSLError):
        return False
    return response.status_code == 200


@pytest.mark.slow
def test_the_readme_example_runs_against_the_quickstart_host(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("retrieval-host")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "retrieval_host.serving.cli"]
    port = free_port()
    process = subprocess.Popen(
        [*cli, "quickstart", "--state-dir", "state", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(
            lambda: _ready(tmp_path / "state" / "ca.pem", port) or process.poll() is not None,
            timeout=120,
            what="the quickstart host",
        )
        assert process.poll() is None, "".join(lines)
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), f"https://127.0.0.1:{port}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
            reader.join(timeout=10)
            process.stdout.close()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^retrieval-host protocol v1: .*scoped-retrieval", out, re.M), out
    assert re.search(r"^\[source:[^\]]+\] \S+@\S+ \((page \d+, )?lines \d+-\d+\)$", out, re.M)
    assert "my-note revision 1: indexed" in out
    assert re.search(r"^run run_\w+ cites \['[^']+'", out, re.M), out
    assert "recorded as: completed" in out
    assert "my-note is gone: SOURCE_UNAVAILABLE (HTTP 404)" in out
    assert out.count("async: [source:") == 2

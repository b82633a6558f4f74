"""The fake OpenAI server's `open_connections` counts the connections of the code under test.

`test_lanes_idle_past_the_keep_alive_expiry_are_closed_at_the_next_call[http]` once saw 4
connections for its 3 lanes (session 44): the readiness probe, which `start` makes and closes,
stayed counted until its handler thread read the close, and a loaded machine put that thread off
past three whole embedding calls (an instrumented run under load measured it up to 224 ms
after `start` returned).
"""

from __future__ import annotations

import threading
from typing import Any, Final

import pytest

from tests.support import fake_openai
from tests.support.fake_openai import FakeOpenAI

# How long the probe's handler thread is held back when `start` waits for it (as it must).
LATE_S: Final = 0.5


def test_start_returns_once_the_readiness_probes_connection_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed_over = threading.Event()
    release = fake_openai._Server.shutdown_request

    def late_release(self: fake_openai._Server, request: Any) -> None:
        # The probe's handler thread, late as a loaded machine made it: until the test has
        # counted, or `LATE_S` when `start` does not return before the release.
        handed_over.wait(timeout=LATE_S)
        release(self, request)

    monkeypatch.setattr(fake_openai._Server, "shutdown_request", late_release)
    server = FakeOpenAI()
    server.start()
    try:
        counted = server.open_connections
        handed_over.set()
    finally:
        server.stop()

    assert counted == 0

"""A streamed run holds its concurrency slot until its stream ends (SPEC §4: retrieval calls and
runs share the host's concurrency limit), and a client that leaves frees it.

A black-box tester reported streamed runs escaping `maxConcurrency` once they had streamed their
first delta. Their client stopped reading there: leaving `iter_lines()` early closes httpx's
connection, the host saw a disconnect, cancelled the run and freed its slot, as documented.
This pins both halves: streams that stay open hold their slots, and streams that are left free
them."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.host import wait_until
from tests.support.observability import CORPUS, HostProcess, host_process

LIMIT = 2
RUN = {
    "provider": "fake",
    "model": "gpt-4o-mini",
    "input": "What does the manual say?",
    "retrieval": {"corpus": CORPUS, "mode": "before"},
}
SEARCH = {"corpus": CORPUS, "query": "valve"}


class OpenStream:
    """A streamed run read to its end on a thread of its own (never left early)."""

    def __init__(self, host: HostProcess) -> None:
        self.status: int | None = None
        self.first_delta = threading.Event()
        self.events: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(host,), daemon=True)
        self._thread.start()

    def _read(self, host: HostProcess) -> None:
        with (
            host.client("writer") as client,
            client.stream(
                "POST", "/v1/runs", json=RUN, headers={"Accept": "text/event-stream"}
            ) as response,
        ):
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("event:"):
                    self.events.append(line.removeprefix("event:").strip())
                    if self.events[-1] == "run.delta":
                        self.first_delta.set()
        self.first_delta.set()  # ended (or refused) without one

    def join(self) -> None:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def _index_manual(host: HostProcess) -> None:
    body = {
        "corpus": CORPUS,
        "source": {"id": "manual", "revision": "r1"},
        "chunks": [{"id": "m-1", "text": "Close the valve before the pump."}],
    }
    with host.client("writer") as writer:
        assert writer.post("/v1/retrieval/index", json=body).status_code == 200


def _search(host: HostProcess) -> httpx.Response:
    with host.client("writer") as writer:
        return writer.post("/v1/retrieval/search", json=SEARCH)


def test_a_streaming_run_holds_its_slot_until_its_stream_ends(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        fake.set_chat_mode("stall", chunks=2)  # one delta, then silence until released
        provider = {"kind": "openai", "baseUrl": fake.base_url, "apiKey": {"env": "KEY"}}
        with host_process(
            tmp_path / "host",
            subjects={"writer": ["fake"]},
            providers={"fake": provider},
            limits={"maxConcurrency": LIMIT},
            environ={"KEY": DEFAULT_API_KEY},
        ) as host:
            _index_manual(host)
            streams = []
            for _ in range(LIMIT + 1):
                stream = OpenStream(host)
                assert stream.first_delta.wait(30)
                streams.append(stream)
            assert [s.status for s in streams] == [200] * LIMIT + [503]
            assert all(s.events[-1] == "run.delta" for s in streams[:LIMIT])
            busy = _search(host)
            assert (busy.status_code, busy.json()["code"]) == (503, "HOST_BUSY")
            fake.release_stalls()
            for stream in streams:
                stream.join()
            assert [s.events[-1] for s in streams[:LIMIT]] == ["run.completed"] * LIMIT
            # The streams ended: their slots are free again.
            assert _search(host).status_code == 200


def test_a_client_that_stops_reading_a_stream_frees_its_slot(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        fake.set_chat_mode("stall", chunks=2)
        provider = {"kind": "openai", "baseUrl": fake.base_url, "apiKey": {"env": "KEY"}}
        with host_process(
            tmp_path / "host",
            subjects={"writer": ["fake"]},
            providers={"fake": provider},
            limits={"maxConcurrency": 1},
            environ={"KEY": DEFAULT_API_KEY},
        ) as host:
            _index_manual(host)
            with (
                host.client("writer") as client,
                client.stream(
                    "POST", "/v1/runs", json=RUN, headers={"Accept": "text/event-stream"}
                ) as response,
            ):
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line == "event: run.delta":
                        break  # leaving the iterator closes the connection (httpcore)
                else:
                    raise AssertionError("the run ended before its first delta")
                # Still inside the `with`: only the disconnect can have freed the slot.
                wait_until(lambda: _search(host).status_code == 200, timeout=30, what="the slot")
            # ... and the run it cancelled hung up on the provider.
            wait_until(lambda: fake.chat_disconnects >= 1, timeout=30, what="the provider call")

"""A host killed in the middle of a run (SIGKILL: nothing recorded at the end): the run reads
as `running` while its host lives and renews its lease, then, from the next host on the same
store, as failed with `INTERRUPTED`, and its idempotency key says `not-completed`."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.fake_openai import DEFAULT_API_KEY, FakeOpenAI
from tests.support.host import wait_until
from tests.support.observability import CORPUS, host_process

LEASE_S = 4.0
RUN = {
    "provider": "fake",
    "model": "gpt-4o-mini",
    "input": "What does the manual say about the intake valve?",
    "retrieval": {"corpus": CORPUS, "mode": "before"},
    "idempotencyKey": "order-42",
}
INDEX = {
    "corpus": CORPUS,
    "source": {"id": "manual", "revision": "r1"},
    "chunks": [{"id": "manual-1", "text": "Close the intake valve before opening the bypass."}],
}


def _status(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_run_whose_host_was_killed_reads_as_interrupted_and_its_key_says_not_completed(
    tmp_path: Path,
) -> None:
    events: list[dict[str, Any]] = []
    with FakeOpenAI() as fake:
        fake.set_chat_mode("stall", chunks=2)  # the model starts answering, then goes silent
        settings: dict[str, Any] = {
            "subjects": {"writer": ["fake"]},
            "providers": {
                "fake": {"kind": "openai", "baseUrl": fake.base_url, "apiKey": {"env": "KEY"}},
            },
            "environ": {"KEY": DEFAULT_API_KEY},
            "runs": {"leaseS": LEASE_S},
        }
        with host_process(tmp_path / "host", **settings) as first:
            tokens = first.tokens
            with first.client("writer") as client:
                assert client.post("/v1/retrieval/index", json=INDEX).status_code == 200

            def stream_run() -> None:
                headers = {"Accept": "text/event-stream"}
                try:
                    with (
                        first.client("writer") as client,
                        client.stream("POST", "/v1/runs", json=RUN, headers=headers) as response,
                    ):
                        for line in response.iter_lines():
                            if line.startswith("data:"):
                                events.append(json.loads(line.removeprefix("data:")))
                except httpx.TransportError:
                    pass  # the host is killed under it

            streamer = threading.Thread(target=stream_run)
            streamer.start()
            wait_until(
                lambda: any(e["type"] == "run.delta" for e in events),
                timeout=30,
                what="the run to stream its first delta and stall",
            )
            run_id = events[0]["runId"]
            # Alive: still running well past its first lease, which its host renews.
            with first.client("writer") as client:
                end = time.monotonic() + 1.5 * LEASE_S
                while time.monotonic() < end:
                    assert _status(client, run_id)["status"] == "running"
                    time.sleep(0.1)  # the subject is time passing: the lease must outlive it
            first.process.kill()
            first.process.wait(timeout=30)
            streamer.join(timeout=30)
        assert not any(e["type"] in ("run.completed", "run.failed") for e in events)

        with host_process(tmp_path / "host", tokens=tokens, **settings) as second:
            with second.client("writer") as client:
                wait_until(
                    lambda: _status(client, run_id)["status"] != "running",
                    timeout=60,
                    what="the killed host's lease to lapse",
                )
                record = _status(client, run_id)
                again = client.post("/v1/runs", json=RUN)
            chats = fake.chat_requests_count
    assert (record["status"], record["errorCode"], record["result"]) == (
        "failed",
        "INTERRUPTED",
        None,
    )
    assert again.status_code == 409, again.text
    problem = again.json()
    assert (problem["code"], problem["reason"]) == ("CONTEXT_REPLAY_UNAVAILABLE", "not-completed")
    assert chats == 1  # the retry generated nothing

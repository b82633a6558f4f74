"""`runs.db` removed under a serving host (`retrieval-host serve`, real uvicorn over TLS): a
black-box test saw /readyz stay ready, runs complete with 200 and usage acknowledged into the
unlinked file, all lost, and the restart refuse without naming which file was missing."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.host import wait_until
from tests.support.observability import CORPUS, host_process

RUN = {
    "provider": "local",
    "model": "extractive",
    "input": "When does the pump run?",
    "retrieval": {"corpus": CORPUS, "mode": "before"},
}
INDEX = {
    "corpus": CORPUS,
    "source": {"id": "pump", "revision": "r1"},
    "chunks": [{"id": "pump-1", "text": "The pump runs at dawn."}],
}
SUBJECTS = {"writer": ["local"]}
PROVIDERS = {"local": {"kind": "extractive"}}


def _stores_down(client: httpx.Client) -> bool:
    answer = client.get("/readyz")
    return answer.status_code == 503 and answer.json()["checks"]["stores"] is False


def test_a_removed_run_database_makes_readiness_and_runs_unavailable(tmp_path: Path) -> None:
    directory = tmp_path / "host"
    with (
        host_process(directory, subjects=SUBJECTS, providers=PROVIDERS) as host,
        host.client("writer") as client,
    ):
        assert client.post("/v1/retrieval/index", json=INDEX).status_code == 200
        done = client.post("/v1/runs", json=RUN)
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        assert client.get("/readyz").status_code == 200
        host.runs_path.unlink()
        wait_until(lambda: _stores_down(client), timeout=30, what="/readyz to report stores down")
        refused = client.post("/v1/runs", json=RUN)
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "STORE_UNAVAILABLE"
        # The run before the removal is not read from the lost file's cache either.
        earlier = client.get(f"/v1/runs/{done.json()['runId']}")
        assert (earlier.status_code, earlier.json()["code"]) == (503, "STORE_UNAVAILABLE")
        # Searches go on (the corpus's store is intact); their usage records are dropped
        # and say so, rather than acknowledged into the lost file.
        searched = client.post("/v1/retrieval/search", json={"corpus": CORPUS, "query": "pump"})
        assert searched.status_code == 200, searched.text
        wait_until(
            lambda: "usage not recorded" in host.log_text(),
            timeout=30,
            what="the dropped usage record to be logged",
        )
        code, _ = host.terminate()
        assert code == 0, host.log_text()
    assert not host.runs_path.exists()
    with host_process(directory, subjects=SUBJECTS, providers=PROVIDERS, wait_ready=False) as again:
        assert again.process.wait(timeout=90) == 2
        again.close()  # every line it printed read
        assert f"the database file {again.runs_path} is missing" in again.log_text()

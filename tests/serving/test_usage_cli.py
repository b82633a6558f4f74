"""Usage records over the real host: searches, ingests and runs over HTTPS are attributed to the
token's subject, corpus, provider instance, account and model, and `retrieval-host usage` shows
them to the operator. A replayed run adds nothing."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.support.host import wait_until
from tests.support.ports import free_port
from tests.support.quickstart import cli, serving

RUN = {
    "provider": "local",
    "model": "extractive",
    "input": "Where do the ingestion helpers put the page numbers?",
    "retrieval": {"corpus": "library", "mode": "before"},
    "idempotencyKey": "usage-test-1",
}


def _usage(cwd: Path, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*cli(), "usage", "--config", "state/host.json", "--json", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _records_once(cwd: Path, count: int) -> list[dict[str, Any]]:
    """The usage records once at least `count` are committed (polled, not slept on)."""
    seen: list[dict[str, Any]] = []

    def enough() -> bool:
        seen[:] = _usage(cwd, "--records")
        return len(seen) >= count

    wait_until(enough, timeout=60, what=f"{count} usage records")
    return seen


def test_searches_ingests_and_runs_are_metered_per_subject_and_shown_to_the_operator(
    tmp_path: Path,
) -> None:
    port = free_port()
    command = [*cli(), "quickstart", "--state-dir", "state", "--port", str(port)]
    state = tmp_path / "state"
    with serving(command, tmp_path, state / "ca.pem", port):
        # The quickstart itself ingested three samples and ran one question. Usage records are
        # committed in groups by a background thread, within one commit of each answer: another
        # process (this command) sees them once that commit is done.
        before = _records_once(tmp_path, 5)
        assert {(r["operation"], r["kind"]) for r in before} == {
            ("ingest", "embedding"),
            ("run", "generation"),
            ("run", "embedding"),
        }
        assert len([r for r in before if r["operation"] == "ingest"]) == 3
        token = (state / "token").read_text().strip()
        trust = ssl.create_default_context(cafile=str(state / "ca.pem"))
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(
            base_url=f"https://127.0.0.1:{port}", verify=trust, headers=headers, timeout=60
        ) as client:
            # The third query is the first again: its vector comes from the host's query cache,
            # spends no model call and so records nothing.
            for query in ("rotate a token", "revoke a token", "rotate a token"):
                search = {"corpus": "library", "query": query}
                assert client.post("/v1/retrieval/search", json=search).status_code == 200
            note = b"# Usage note\n\nA passage about metering embedding calls.\n"
            ingest = client.post(
                "/v1/retrieval/ingest",
                params={"corpus": "library", "sourceId": "usage-note"},
                content=note,
                headers={"Content-Type": "text/markdown"},
            )
            assert ingest.status_code == 200, ingest.text
            first = client.post("/v1/runs", json=RUN)
            assert first.status_code == 200, first.text
            replay = client.post("/v1/runs", json=RUN)
            assert replay.json()["replayed"] is True
            run_id = first.json()["runId"]
        after = _usage(tmp_path, "--records", "--since", before[-1]["at"])
        new = [r for r in after if r not in before]

    searches = [r for r in new if r["operation"] == "search"]
    assert len(searches) == 2
    assert all(
        (r["subject"], r["corpus"], r["kind"], r["provider"], r["account"], r["model"])
        == ("quickstart", "library", "embedding", "local-minilm", "local", "all-MiniLM-L6-v2-int8")
        for r in searches
    )
    assert all(r["requests"] == 1 and r["input_tokens"] > 0 for r in searches)
    [ingested] = [r for r in new if r["operation"] == "ingest"]
    assert (ingested["corpus"], ingested["kind"]) == ("library", "embedding")
    # One run, metered once: the replay spent nothing and recorded nothing.
    runs = [r for r in new if r["operation"] == "run"]
    assert {r["run_id"] for r in runs} == {run_id}
    [generation] = [r for r in runs if r["kind"] == "generation"]
    assert (generation["provider"], generation["account"], generation["model"]) == (
        "local",
        "local",
        "extractive",
    )
    assert [r["kind"] for r in runs].count("embedding") == 1

    # The default view sums per subject, corpus, operation, kind, provider, account and model.
    summed = _usage(tmp_path)
    search_total = next(r for r in summed if r["operation"] == "search")
    assert search_total["requests"] == 2
    assert search_total["input_tokens"] == sum(r["input_tokens"] for r in searches)
    assert _usage(tmp_path, "--subject", "nobody") == []
    table = subprocess.run(
        [*cli(), "usage", "--config", "state/host.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert table[0].split()[:4] == ["subject", "corpus", "operation", "kind"]
    assert any(
        line.split()[:4] == ["quickstart", "library", "search", "embedding"] for line in table
    )


def test_since_is_an_instant_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    # A black-box tester found --since compared as text: offsets ignored, `...T00:23Z` leaving
    # out records of 00:23:xx, lower case matching nothing, and garbage an empty report.
    from retrieval_host.core.corpus import utc_now
    from retrieval_host.serving.usage_cli import instant

    assert instant("2026-12-05T00:24:53-05:00") == "2026-12-05T05:24:53.000Z"
    assert instant("2026-12-05T00:24:53+02:00") == "2026-12-04T22:24:53.000Z"
    assert instant("2026-12-05t00:23z") == "2026-12-05T00:23:00.000Z"
    assert instant("2026-12-05") == "2026-12-05T00:00:00.000Z"
    at = "2026-12-05T00:23:17.404Z"  # as records write it
    assert len(at) == len(utc_now()) and at[-1] == utc_now()[-1] == "Z"
    assert at >= instant("2026-12-05T00:23Z") and at < instant("2026-12-05T00:24Z")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "host.json").write_text(json.dumps({"listen": {"port": 8443}, "behindProxy": True}))
    for bad in (["--since", "yesterday"], ["--since", "2026-12-01T00:00:00"], ["--limit", "-1"]):
        done = subprocess.run(
            [*cli(), "usage", "--config", "state/host.json", *bad],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (bad, done.stderr)
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_report_on_a_store_without_records_says_so_and_creates_nothing(tmp_path: Path) -> None:
    # A black-box test: a mistyped store path made an empty `runs.db` and printed an empty
    # table, read as "nothing was spent".
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = {"listen": {"port": 8443}, "behindProxy": True, "store": {"sqlitePath": "typo/x.db"}}
    (state / "host.json").write_text(json.dumps(config))
    done = subprocess.run(
        [*cli(), "usage", "--config", "state/host.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "no usage records" in done.stderr and "runs.db does not exist" in done.stderr
    assert not (state / "typo").exists()

"""Two `retrieval-host serve` processes on one PostgreSQL database: what one commits, the
other serves at once; run records are shared, so a replay works on either replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retrieval_host_client import validate_source_citations
from tests.support.observability import host_process, parse_metrics, total

NOTE = b"# Otters\n\nSea otters hold hands while they sleep so that they do not drift apart.\n"
QUESTION = "Why do sea otters hold hands?"


def test_two_host_replicas_share_passages_and_run_records(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    shared = tmp_path / "app"
    shared.mkdir(mode=0o700)

    def replica(name: str, tokens: dict[str, str] | None = None) -> Any:
        return host_process(
            tmp_path / name,
            subjects={"alice": ["local"], "scraper": []},
            providers={"local": {"kind": "extractive"}},
            # The DSN (with its password) is a secret: named in the file, read from the env.
            store={"postgresDsn": {"env": "RH_TEST_PG_DSN"}, "postgresSchema": pg_schema},
            shared=shared,
            environ={"RH_TEST_PG_DSN": pg_dsn},
            tokens=tokens,
        )

    with replica("a") as a, replica("b", a.tokens) as b:
        try:
            with a.client("alice") as on_a, b.client("alice") as on_b:
                ingest = {"corpus": "library", "sourceId": "otters"}
                headers = {"Content-Type": "text/markdown"}
                first = on_a.post(
                    "/v1/retrieval/ingest", params=ingest, content=NOTE, headers=headers
                )
                assert first.status_code == 200, first.text
                assert first.json()["status"] == "indexed"

                # Visible through B as soon as A answered.
                found = on_b.post(
                    "/v1/retrieval/search", json={"corpus": "library", "query": QUESTION}
                ).json()
                assert [h["source"]["id"] for h in found["hits"]] == ["otters"]
                assert found["hits"][0]["source"]["revision"] == first.json()["source"]["revision"]

                again = on_b.post(
                    "/v1/retrieval/ingest", params=ingest, content=NOTE, headers=headers
                )
                assert again.json()["status"] == "unchanged"

                body = {
                    "provider": "local",
                    "model": "extractive",
                    "input": QUESTION,
                    "retrieval": {"corpus": "library"},
                    "idempotencyKey": "otters-1",
                }
                ran = on_a.post("/v1/runs", json=body).json()
                validate_source_citations(
                    ran["text"], [s["id"] for s in ran["sources"]], require_citation=True
                )

                with b.client("scraper") as scrape:
                    before = parse_metrics(scrape.get("/metrics").text)
                    replayed = on_b.post("/v1/runs", json=body).json()
                    after = parse_metrics(scrape.get("/metrics").text)
                assert replayed["replayed"] is True
                assert (replayed["runId"], replayed["text"]) == (ran["runId"], ran["text"])
                name = "retrieval_host_embedding_requests_total"
                assert total(after, name) == total(before, name)  # nothing embedded again
                record = on_b.get(f"/v1/runs/{ran['runId']}").json()
                assert record["status"] == "completed"
                assert record["result"]["text"] == ran["text"]
        finally:
            assert pg_dsn not in a.log_text() + b.log_text()

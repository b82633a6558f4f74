"""A read-only store (`store.readOnly`) on a real PostgreSQL hot standby.

README promises that `readOnly: true` serves a hot standby: nothing created or migrated, the
sessions read-only. These tests make a streaming-replication standby of the test server
(`tests.support.pg_standby`), write on the primary, wait until the standby replayed it, and
read it there: through the store, and through a whole read-only host over HTTPS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from retrieval_host.adapters.postgres import PgVectorStore
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import DEFAULT_ANALYZER, query_terms
from retrieval_host.core.ports import CapacityLimits
from tests.support.observability import host_process
from tests.support.pg import PgServer
from tests.support.pg_standby import Standby, copyable_primary, hot_standby
from tests.support.sqlite_store import descriptor, revision, unit_vectors

CORPUS = "c1"
NS = "ns"
TEXTS = {
    "otters": ["Sea otters hold hands while they sleep.", "Otters crack urchins on stones."],
    "herons": ["Grey herons nest in colonies.", "A heron waits still in shallow water."],
}
NOTE = b"# Otters\n\nSea otters hold hands while they sleep so that they do not drift apart.\n"


@pytest.fixture(scope="module")
def primary(pg_dsn: str) -> Iterator[PgServer]:
    """The server the standby copies: the session's, or a private one when that is external
    (`pg_schema` then names a schema on the external server that the test never makes there;
    the private server, schema and all, is deleted afterwards)."""
    with copyable_primary() as server:
        yield server


@pytest.fixture(scope="module")
def standby(primary: PgServer) -> Iterator[Standby]:
    with hot_standby(primary) as replica:
        yield replica


def test_a_read_only_store_on_a_hot_standby_serves_what_the_primary_indexed(
    primary: PgServer, standby: Standby, pg_schema: str
) -> None:
    rng = np.random.default_rng(7)
    vectors = {source: unit_vectors(rng, len(texts)) for source, texts in TEXTS.items()}
    with PgVectorStore.open(primary.dsn, schema=pg_schema) as writer:
        writer.open_corpus(descriptor(CORPUS))
        for source, texts in TEXTS.items():
            stored, chunks = revision(source, "r1", vectors[source], texts=texts)
            writer.replace_source(
                CORPUS, NS, stored, chunks, expected_revision=None, limits=CapacityLimits()
            )
    standby.wait_replayed(primary.dsn)

    grant = {"otters": "r1", "herons": "r1"}
    with PgVectorStore.open(standby.dsn, schema=pg_schema, read_only=True) as reader:
        reader.open_corpus(descriptor(CORPUS))
        assert reader.current_revisions(CORPUS, NS, None) == grant

        query = vectors["herons"][1]
        cosines = {
            f"{source}:{i}": float(row @ query)
            for source, rows in vectors.items()
            for i, row in enumerate(rows)
        }
        dense = reader.search(CORPUS, NS, grant, query, 4, CancelToken())
        assert [h.chunk_id for h in dense] == sorted(cosines, key=lambda c: -cosines[c])
        assert [h.score for h in dense] == pytest.approx(sorted(cosines.values())[::-1], abs=1e-5)
        assert dense[0].text == TEXTS["herons"][1]

        terms = query_terms("Why do otters hold hands?", DEFAULT_ANALYZER)
        lexical = reader.lexical_search(CORPUS, NS, grant, terms, 4, CancelToken())
        assert [h.chunk_id for h in lexical] == ["otters:0", "otters:1"]

        stored, chunks = revision("otters", "r2", vectors["otters"], texts=TEXTS["otters"])
        for write in (
            lambda: reader.replace_source(
                CORPUS, NS, stored, chunks, expected_revision="r1", limits=CapacityLimits()
            ),
            lambda: reader.delete_source(CORPUS, NS, "herons", "r1"),
        ):
            with pytest.raises(RetrievalError) as excinfo:
                write()
            assert excinfo.value.code is ErrorCode.STORE_READ_ONLY
        assert reader.current_revisions(CORPUS, NS, None) == grant


def test_a_writable_store_on_a_hot_standby_is_refused_with_a_typed_error(
    primary: PgServer, standby: Standby, pg_schema: str
) -> None:
    PgVectorStore.open(primary.dsn, schema=pg_schema).close()
    standby.wait_replayed(primary.dsn)
    with pytest.raises(RetrievalError) as excinfo:
        PgVectorStore.open(standby.dsn, schema=pg_schema).close()
    # Not "the database failed": the operator is told it is read-only, and what to set.
    error = excinfo.value
    assert error.code is ErrorCode.STORE_READ_ONLY, error
    assert "store.readOnly" in error.detail, error.detail


def test_a_read_only_host_on_a_hot_standby_answers_searches_over_https(
    tmp_path: Path, primary: PgServer, standby: Standby, pg_schema: str
) -> None:
    shared = tmp_path / "app"
    shared.mkdir(mode=0o700)
    store = {"postgresDsn": {"env": "RH_TEST_PG_DSN"}, "postgresSchema": pg_schema}
    # The writable host on the primary makes the corpus (its descriptor is the host's own).
    with host_process(
        tmp_path / "writer",
        subjects={"alice": []},
        store=store,
        shared=shared,
        environ={"RH_TEST_PG_DSN": primary.dsn},
    ) as writer:
        with writer.client("alice") as client:
            ingested = client.post(
                "/v1/retrieval/ingest",
                params={"corpus": "library", "sourceId": "otters"},
                content=NOTE,
                headers={"Content-Type": "text/markdown"},
            )
        assert ingested.status_code == 200, ingested.text
        tokens = writer.tokens
    standby.wait_replayed(primary.dsn)

    # A standby records no runs: this replica keeps its own in `runs.sqlitePath`.
    with host_process(
        tmp_path / "reader",
        subjects={"alice": ["local"]},
        providers={"local": {"kind": "extractive"}},
        store=store | {"readOnly": True},
        runs={"sqlitePath": str(tmp_path / "reader-runs" / "runs.db")},
        shared=shared,
        environ={"RH_TEST_PG_DSN": standby.dsn},
        tokens=tokens,
    ) as reader:
        with reader.client("alice") as client:
            found = client.post(
                "/v1/retrieval/search",
                json={"corpus": "library", "query": "Why do sea otters hold hands?"},
            )
            assert found.status_code == 200, found.text
            hits = found.json()["hits"]
            assert [h["source"]["id"] for h in hits] == ["otters"]
            assert hits[0]["source"]["revision"] == ingested.json()["source"]["revision"]

            refused = client.post(
                "/v1/retrieval/ingest",
                params={"corpus": "library", "sourceId": "herons"},
                content=b"# Herons\n\nGrey herons nest in colonies.\n",
                headers={"Content-Type": "text/markdown"},
            )
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "STORE_READ_ONLY"

            run = client.post(
                "/v1/runs",
                json={
                    "provider": "local",
                    "model": "extractive",
                    "input": "Why do sea otters hold hands?",
                    "retrieval": {"corpus": "library", "mode": "before"},
                },
            )
            assert run.status_code == 200, run.text
            assert [s["source"]["id"] for s in run.json()["sources"]] == ["otters"]
            recorded = client.get(f"/v1/runs/{run.json()['runId']}")
            assert recorded.status_code == 200 and recorded.json()["status"] == "completed"
        assert standby.dsn not in reader.log_text()

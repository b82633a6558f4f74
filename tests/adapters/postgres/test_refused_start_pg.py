"""A start refused for its configuration leaves an earlier release's PostgreSQL schema as it
was (`tests/serving/test_refused_start.py` for SQLite): the corpus descriptor and the vector
store's version are checked, reading only, before the run records are created or migrated
and before the vector store is migrated (probe U's follow-up: a `DESCRIPTOR_MISMATCH` was
found when the service was built, after both)."""

from __future__ import annotations

import json
import logging.config
from pathlib import Path
from typing import Any

import pytest
import trustme
from psycopg import sql

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.postgres.catalog import peek_descriptors
from retrieval_host.core.descriptor import CorpusDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.serving.cli import main
from tests.support.pg import connect
from tests.support.previous_vector_store import pg_v2_schema

REPO = Path(__file__).resolve().parents[3]
ACL = {"subjects": {"alice": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}


def _schema_state(dsn: str, schema: str) -> tuple[list[tuple[str, int]], list[str]]:
    """The components' versions and the tables of `schema`."""
    with connect(dsn) as conn:
        versions = conn.execute(
            sql.SQL("SELECT component, version FROM {}.schema_version ORDER BY 1").format(
                sql.Identifier(schema)
            )
        ).fetchall()
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        ).fetchall()
    return [(str(c), int(v)) for c, v in versions], [str(t) for (t,) in tables]


@pytest.fixture
def host_file(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    local_embedding: LocalEmbedding,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Path, dict[str, Any]]:
    """A host file over an earlier release's schema (vector store version 2, corpus `library`
    built as passages-v1, no run records yet); a provider makes the host open run records."""
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: None)
    leaf = trustme.CA().issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "server-key.pem"))
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    described = CorpusDescriptor(
        "library", "passages-v1", local_embedding.descriptor, ChunkingSettings().as_identity()
    )
    pg_v2_schema(pg_dsn, pg_schema, described, {("docs", "old"): ["An old passage."]})
    host = json.loads((REPO / "config" / "host.example.json").read_text())
    host.update(
        listen={"host": "127.0.0.1", "port": 0, "workers": 1},
        tls={"certFile": "server.pem", "keyFile": "server-key.pem"},
        providers={"local": {"kind": "extractive"}},
        store={"postgresDsn": {"env": "RH_TEST_PG_DSN"}, "postgresSchema": pg_schema},
        applicationOptions={"aclFile": "acl.json", "corpora": ["library"]},
    )
    host["limits"].pop("inlineSearchMs", None)  # SQLite only
    return tmp_path / "host.json", host


def test_a_corpus_configured_unlike_the_stored_one_is_refused_before_anything_changes(
    host_file: tuple[Path, dict[str, Any]],
    pg_dsn: str,
    pg_schema: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, host = host_file
    host["applicationOptions"]["indexVersion"] = "passages-v2"
    config.write_text(json.dumps(host))
    before = _schema_state(pg_dsn, pg_schema)
    assert before[0] == [("vector-store", 2)]

    assert main(["serve", "--config", str(config)], environ={"RH_TEST_PG_DSN": pg_dsn}) == 2

    [line] = [s for s in capsys.readouterr().err.splitlines() if s.startswith("retrieval-host")]
    assert "DESCRIPTOR_MISMATCH: corpus 'library' was built with a different descriptor" in line
    assert _schema_state(pg_dsn, pg_schema) == before  # no run tables made, nothing migrated


def test_peeking_reads_an_earlier_schema_s_descriptors_and_refuses_a_newer_one(
    pg_dsn: str, pg_schema: str, local_embedding: LocalEmbedding
) -> None:
    assert peek_descriptors(pg_dsn, pg_schema) == {}  # no schema: the open makes it
    with connect(pg_dsn) as conn:
        made = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,))
        assert made.fetchone() is None

    described = CorpusDescriptor("library", "passages-v1", local_embedding.descriptor, {})
    pg_v2_schema(pg_dsn, pg_schema, described, {("docs", "old"): ["An old passage."]})
    before = _schema_state(pg_dsn, pg_schema)
    stored = peek_descriptors(pg_dsn, pg_schema)
    assert list(stored) == ["library"]
    assert json.loads(stored["library"])["index_version"] == "passages-v1"
    assert _schema_state(pg_dsn, pg_schema) == before

    with connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.schema_version SET version = 99").format(sql.Identifier(pg_schema))
        )
    with pytest.raises(RetrievalError) as refused:
        peek_descriptors(pg_dsn, pg_schema)
    assert refused.value.code is ErrorCode.UNSAFE_STORE
    assert "version 99" in refused.value.detail

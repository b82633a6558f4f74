"""The SQLite store's file identity, pragmas and reclamation, checked on real database files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw
import numpy as np
import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore, SqliteVectorStore
from retrieval_host.adapters.sqlite.schema import (
    check_identity,
    check_sqlite_version,
    create_schema,
)
from retrieval_host.adapters.sqlite.tables import APPLICATION_ID, IDENTITY, SCHEMA_VERSION
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import CapacityLimits
from tests.support.sqlite_store import descriptor, revision, unit_vectors


def raw_database(path: Path, *statements: str) -> Path:
    path.touch(mode=0o600)
    conn = apsw.Connection(str(path))
    for statement in statements:
        conn.execute(statement)
    conn.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(path: Path, reason: str) -> None:
    before = digest(path)
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(path)
    assert excinfo.value.code is ErrorCode.UNSAFE_STORE, excinfo.value
    assert excinfo.value.reason == reason
    assert digest(path) == before  # the refused file was not touched


def test_the_bundled_sqlite_is_recent_enough() -> None:
    check_sqlite_version(apsw.sqlite_lib_version())
    for ok in ("3.51.3", "3.54.1", "3.100.0", "4.0.0"):
        check_sqlite_version(ok)
    for old in ("3.51.2", "3.45.1", "2.8.17", "garbage"):
        with pytest.raises(RetrievalError) as excinfo:
            check_sqlite_version(old)
        assert excinfo.value.code is ErrorCode.UNSAFE_STORE
        assert excinfo.value.reason == "sqlite-version"


def test_a_database_of_another_application_is_refused(tmp_path: Path) -> None:
    path = raw_database(
        tmp_path / "app.db", "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)"
    )
    refused(path, "unrelated-database")


def test_a_database_with_another_application_id_is_refused(tmp_path: Path) -> None:
    refused(raw_database(tmp_path / "other.db", "PRAGMA application_id=1234"), "unrelated-database")


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    SqliteVectorStore.open(tmp_path / "store.db").close()
    raw_database(tmp_path / "store.db", f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    refused(tmp_path / "store.db", "schema-version")


def test_our_application_id_without_our_tables_is_refused(tmp_path: Path) -> None:
    path = raw_database(
        tmp_path / "fake.db",
        f"PRAGMA application_id={APPLICATION_ID}",
        f"PRAGMA user_version={SCHEMA_VERSION}",
        "CREATE TABLE something (x)",
    )
    refused(path, "unrelated-database")


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages you are looking for\n" * 200)
    path.chmod(0o600)
    refused(path, "not-a-database")


def test_a_store_reopens_with_its_data_and_settings(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    v = unit_vectors(np.random.default_rng(0), 3)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        source, chunks = revision("a", "r1", v)
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )

    raw = apsw.Connection(str(path))
    try:
        assert raw.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
        assert raw.execute("PRAGMA application_id").fetchall() == [(APPLICATION_ID,)]
        assert raw.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        raw.close()

    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        assert store.get_source("c1", "ns", "a") == source
        hits = store.search("c1", "ns", {"a": "r1"}, v[2], 1, CancelToken())
        assert [h.chunk_id for h in hits] == ["a:2"]


def test_delete_cascades_and_overwrites_the_deleted_text(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    marker = "QUOKKA-SECRET-PASSAGE-7d1f"
    v = unit_vectors(np.random.default_rng(0), 2)
    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        keep, keep_chunks = revision("keep", "r1", v)
        gone, gone_chunks = revision("gone", "r1", v, texts=[marker * 20, marker])
        for s, c in ((keep, keep_chunks), (gone, gone_chunks)):
            store.replace_source("c1", "ns", s, c, expected_revision=None, limits=CapacityLimits())
        assert store.delete_source("c1", "ns", "gone", "r1") == 2

        files = [p for p in tmp_path.iterdir() if p.name.startswith("store.db")]
        assert all(marker.encode() not in p.read_bytes() for p in files)
        raw = apsw.Connection(str(path))
        try:
            # Foreign keys are on: the passages went with their source row.
            assert raw.execute("SELECT COUNT(*) FROM chunks").fetchall() == [(2,)]
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        finally:
            raw.close()


def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SqliteVectorStore.open(tmp_path / "store.db")
    store.open_corpus(descriptor("c1"))
    store.close()
    store.close()  # idempotent
    with pytest.raises(RetrievalError) as excinfo:
        store.get_source("c1", "ns", "a")
    assert (excinfo.value.code, excinfo.value.reason) == (ErrorCode.STORE_UNAVAILABLE, "closed")
    with pytest.raises(RetrievalError) as excinfo:
        store.search("c1", "ns", {"a": "r1"}, np.ones(8, dtype=np.float32), 1, CancelToken())
    assert excinfo.value.reason == "closed"


def test_scan_batch_rows_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scan_batch_rows"):
        SqliteVectorStore.open(tmp_path / "store.db", scan_batch_rows=0)


def test_a_schema_created_while_another_opener_checks_the_file_is_not_seen_half_way(
    tmp_path: Path,
) -> None:
    # Two workers open a new store at once: one creates the schema while the other reads the
    # file's identity. A commit between the identity's reads once showed tables without an
    # application id ("another application's database"): the reads are one snapshot now.
    path = tmp_path / "store.db"
    path.touch(mode=0o600)
    checker = apsw.Connection(str(path))
    creator = apsw.Connection(str(path))
    creator.set_busy_timeout(200)
    attempts: list[str] = []

    def create_between_reads(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        if sql.startswith("PRAGMA user_version") and not attempts:
            try:
                create_schema(creator, IDENTITY)
                attempts.append("committed")
            except apsw.BusyError:
                attempts.append("waited for the reader's snapshot")
        return True

    checker.exec_trace = create_between_reads
    try:
        assert check_identity(checker, IDENTITY) is None  # what it saw: the empty file, whole
        assert attempts == ["waited for the reader's snapshot"]
        checker.exec_trace = None
        create_schema(creator, IDENTITY)
        assert check_identity(checker, IDENTITY) == IDENTITY.version
    finally:
        checker.close()
        creator.close()


def test_a_store_of_the_previous_version_gets_the_index_of_passages_without_terms(
    tmp_path: Path,
) -> None:
    # Version 3 (the previous release) is this schema without the partial index: every corpus
    # open read every passage to find those without terms.
    tmp_path.chmod(0o700)
    path = tmp_path / "store.db"
    v = unit_vectors(np.random.default_rng(3), 3)
    with SqliteVectorStore.open(path, snapshots=False) as store:
        store.open_corpus(descriptor("c1"))
        source, chunks = revision("a", "r1", v)
        store.replace_source(
            "c1", "ns", source, chunks, expected_revision=None, limits=CapacityLimits()
        )
    raw = apsw.Connection(str(path))
    raw.execute("DROP INDEX chunks_without_terms")
    raw.execute("PRAGMA user_version=3")
    raw.close()

    with SqliteVectorStore.open(path) as store:
        store.open_corpus(descriptor("c1"))
        hits = store.search("c1", "ns", {"a": "r1"}, v[1], 1, CancelToken())
        assert [h.chunk_id for h in hits] == ["a:1"]
    raw = apsw.Connection(str(path))
    try:
        assert raw.execute("PRAGMA user_version").fetchall() == [(SCHEMA_VERSION,)]
        plan = " ".join(
            str(row[-1])
            for row in raw.execute(
                "EXPLAIN QUERY PLAN SELECT rowid, text FROM chunks "
                "WHERE corpus_id = ? AND terms IS NULL",
                ("c1",),
            )
        )
        assert "chunks_without_terms" in plan  # no scan of every passage
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        raw.close()


@pytest.mark.parametrize("store", [SqliteVectorStore, SqliteRunStore], ids=["vectors", "runs"])
def test_a_store_that_cannot_be_created_where_it_is_configured_is_a_typed_refusal(
    store: type[SqliteVectorStore] | type[SqliteRunStore],
) -> None:
    # A black-box test: a store on a read-only volume (and the run records beside a store
    # served read-only from one) stopped the start with an untyped OSError and a traceback.
    # sysfs refuses a new file to every user, root included, as a read-only mount does.
    with pytest.raises(RetrievalError) as refused:
        store.open("/sys/retrieval-host-test.sqlite")
    assert (refused.value.code, refused.value.reason) == (
        ErrorCode.STORE_UNAVAILABLE,
        "unwritable",
    )
    assert refused.value.detail.startswith("cannot create /sys/retrieval-host-test.sqlite: ")
    assert "store.readOnly" in refused.value.detail


def test_a_store_under_a_file_says_that_it_is_no_directory(tmp_path: Path) -> None:
    # A black-box test: "the directory ... does not exist; create it first" for a path that
    # existed as a regular file.
    (tmp_path / "token").write_text("x")
    with pytest.raises(RetrievalError) as refused:
        SqliteVectorStore.open(tmp_path / "token" / "x" / "store.sqlite")
    assert (refused.value.code, refused.value.reason) == ("UNSAFE_STORE", "not-a-directory")
    assert refused.value.detail == f"{tmp_path / 'token'} is not a directory."

"""The PostgreSQL schema: our tables in one dedicated schema, checked or created on first use.

Tables live in one PostgreSQL schema (default `retrieval_host`): `corpora` (descriptor,
dimensions, payload total), `sources` (one row per current revision), `chunks` (text, location
and an untyped `vector` column, so corpora of different dimensions share the table) and
`schema_version` (one row per component: `vector-store`, and `run-store` for the run store).
`ensure_schema_component` creates a component's tables under an advisory lock and refuses a
schema whose tables exist without our version row, with another version, or another shape
(`UNSAFE_STORE`, reasons `unrelated-database` / `schema-version`, as SQLite). The `vector`
extension is created if missing (that needs the privilege; otherwise a DBA creates it once).
A read-only store creates and migrates nothing, extension included: it only checks.
The only composed SQL parts are the schema identifier (checked against `[a-z_][a-z0-9_]*`, then
quoted) and, for the HNSW index, the corpus dimension (an integer from the descriptor).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from retrieval_host.adapters.postgres.media_types import fill_media_types
from retrieval_host.adapters.postgres.pool import (
    Connection,
    lock_key,
    transaction,
    translated,
    unbounded,
)
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason, UnsafeStoreReason

DEFAULT_SCHEMA: Final = "retrieval_host"
VECTOR_COMPONENT: Final = "vector-store"
VECTOR_SCHEMA_VERSION: Final = 4
HNSW_MAX_DIMENSIONS: Final = 2000  # pgvector's limit for an HNSW index on `vector`
HNSW_BUILD_MEMORY: Final = "512MB"
HNSW_BUILD_WAIT_S: Final = 3600.0  # how long a replica waits for another one's index build
_SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_VERSION_TABLE: Final[Mapping[str, str]] = {"component": "text", "version": "int4"}
# One step of a migration: a statement (`{s}` names the schema), or a function run with the
# connection and the schema inside the migration's transaction, for what SQL alone cannot
# decide (the media-type backfill derives passage ids from their text: `media_types`).
MigrationStep = str | Callable[[Connection, str], None]

_log = logging.getLogger(__name__)


def _unsafe(detail: str, reason: UnsafeStoreReason) -> RetrievalError:
    return RetrievalError(ErrorCode.UNSAFE_STORE, detail, reason=reason)


def schema_sql(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


def check_schema_name(schema: str) -> str:
    """Accept a lowercase SQL identifier (it is quoted anyway; this keeps it unsurprising)."""
    if not _SCHEMA_NAME.match(schema):
        raise ValueError("schema must match [a-z_][a-z0-9_]{0,62}")
    return schema


def ensure_schema_component(
    conn: Connection,
    schema: str,
    component: str,
    version: int,
    tables: Mapping[str, Mapping[str, str]],
    ddl: Sequence[str],
    migrations: Mapping[int, Sequence[MigrationStep]] | None = None,
    backfill: Callable[[Connection, int], None] | None = None,
    *,
    migrate: bool = True,
    create: bool | None = None,
    read_only: bool = False,
) -> None:
    """Create `component`'s tables in `schema` on first use, or check they are ours.

    Runs in one transaction under an advisory lock, so replicas starting together create the
    schema once. `migrations[v]` holds the steps that bring version v to v + 1: a schema
    an earlier release wrote is upgraded in that same transaction, and then `backfill` (when
    given) is called with the connection and the version found, to fill what SQL alone
    cannot (the lexical index is analyzed from stored text in Python). Refuses (`UNSAFE_STORE`) a
    schema holding tables without our version table, our table names without our version row,
    a version it cannot reach, or another table shape; with `migrate=False` also a component
    of an earlier version, and one not there yet unless `create` (default: `migrate`): a
    migration is the host's, at its start, not an operator command's. `read_only` (a read-only
    store) only checks, in a read-only transaction: a component not there, or of an earlier
    version, is refused as SQLite refuses such a store (`STORE_UNAVAILABLE` `missing-store`,
    `STORE_READ_ONLY`), never created or migrated.
    """
    creates = not read_only and (migrate if create is None else create)
    migrate = migrate and not read_only

    def refused(stored: int | None) -> RetrievalError:
        if read_only:
            return _read_only_refusal(schema, component, stored, version)
        return _not_migrated(component, stored, version)

    with translated("preparing the schema"), transaction(conn, read_only=read_only):
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s)", (lock_key("retrieval-host-schema", schema),)
        )
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if exists is None:
            if not creates:
                raise refused(None)
            conn.execute(schema_sql(schema, "CREATE SCHEMA {s}"))
        present = {
            str(r[0])
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                (schema,),
            )
        }
        stored: int | None = None
        if "schema_version" not in present:
            if present:
                raise _unsafe(
                    f"schema {schema!r} holds tables of another application; point the store "
                    "at its own schema.",
                    UnsafeStoreReason.UNRELATED_DATABASE,
                )
            if not creates:
                raise refused(None)
            conn.execute(
                schema_sql(
                    schema,
                    "CREATE TABLE {s}.schema_version "
                    "(component text PRIMARY KEY, version integer NOT NULL)",
                )
            )
        else:
            _check_shape(conn, schema, {"schema_version": _VERSION_TABLE})
            row = conn.execute(
                schema_sql(schema, "SELECT version FROM {s}.schema_version WHERE component = %s"),
                (component,),
            ).fetchone()
            stored = None if row is None else int(row[0])
        if stored is None and not creates:
            raise refused(stored)
        if stored is not None and stored != version and not migrate:
            raise refused(stored)
        if stored is None:
            if present & set(tables):
                raise _unsafe(
                    f"schema {schema!r} holds tables named like ours without our version "
                    "record; it was not written by this host.",
                    UnsafeStoreReason.UNRELATED_DATABASE,
                )
            for statement in ddl:
                conn.execute(schema_sql(schema, statement))
            conn.execute(
                schema_sql(
                    schema, "INSERT INTO {s}.schema_version (component, version) VALUES (%s, %s)"
                ),
                (component, version),
            )
        else:
            steps = migrations or {}
            if stored > version or any(v not in steps for v in range(stored, version)):
                raise _unsafe(
                    f"the {component} schema has version {stored}; this host reads version "
                    f"{version}.",
                    UnsafeStoreReason.SCHEMA_VERSION,
                )
            for step in range(stored, version):
                for migration_step in steps[step]:
                    if isinstance(migration_step, str):
                        conn.execute(schema_sql(schema, migration_step))
                    else:
                        migration_step(conn, schema)
            if stored != version and backfill is not None:
                backfill(conn, stored)
            if stored != version:
                conn.execute(
                    schema_sql(
                        schema, "UPDATE {s}.schema_version SET version = %s WHERE component = %s"
                    ),
                    (version, component),
                )
                _log.info(
                    "migrated the %s schema %r from version %d to %d (an earlier release can "
                    "no longer open it)",
                    component,
                    schema,
                    stored,
                    version,
                )
            _check_shape(conn, schema, tables)


def _not_migrated(component: str, stored: int | None, version: int) -> RetrievalError:
    found = "is not there yet" if stored is None else f"has version {stored}"
    verb = "create" if stored is None else "migrate"
    return _unsafe(
        f"the {component} schema {found}; this release reads version {version} and this "
        f"command does not {verb} it: start the host of this release first (it migrates at "
        "its start), or run the command of the release that serves the store.",
        UnsafeStoreReason.SCHEMA_VERSION,
    )


def _read_only_refusal(
    schema: str, component: str, stored: int | None, version: int
) -> RetrievalError:
    """Why a read-only store cannot open the component, in the words of the SQLite store's
    refusals (`sqlite.schema.open_database`)."""
    if stored is None:
        return RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            f"there is no {component} in schema {schema!r} to open read-only, and a read-only "
            "store creates nothing: check store.postgresSchema, or open it writable once first.",
            reason=StoreUnavailableReason.MISSING_STORE,
        )
    if stored > version:
        return _unsafe(
            f"the {component} schema has version {stored}; this host reads version {version}.",
            UnsafeStoreReason.SCHEMA_VERSION,
        )
    return RetrievalError(
        ErrorCode.STORE_READ_ONLY,
        f"a store opened read-only must be of schema version {version} (the {component} "
        f"schema {schema!r} is {stored}); open it writable once to migrate it.",
    )


def _check_shape(conn: Connection, schema: str, tables: Mapping[str, Mapping[str, str]]) -> None:
    found: dict[str, dict[str, str]] = {}
    for table, column, udt in conn.execute(
        "SELECT table_name, column_name, udt_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = ANY(%s)",
        (schema, list(tables)),
    ):
        found.setdefault(str(table), {})[str(column)] = str(udt)
    if not found and tables:
        # information_schema shows only what the role may use: a role without rights on the
        # schema's tables sees none (it was told they "were not written by this host").
        raise _unsafe(
            f"the role cannot see the tables in schema {schema!r}: grant it USAGE on the "
            "schema and SELECT, INSERT, UPDATE, DELETE on its tables (or connect as their "
            "owner).",
            UnsafeStoreReason.UNRELATED_DATABASE,
        )
    if found != {name: dict(columns) for name, columns in tables.items()}:
        raise _unsafe(
            f"the tables in schema {schema!r} do not have the shape this host writes; they "
            "were not written by it.",
            UnsafeStoreReason.UNRELATED_DATABASE,
        )


def extension(conn: Connection) -> tuple[str, tuple[int, ...]] | None:
    row = conn.execute(
        "SELECT n.nspname, e.extversion FROM pg_extension e "
        "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None:
        return None
    version = tuple(int(p) for p in re.findall(r"\d+", str(row[1]))[:3])
    return str(row[0]), version


def session_setup(statement_timeout_ms: int, read_only: bool) -> Callable[[Connection], None]:
    """How the store sets up each pooled connection: pgvector's types registered, only the
    extension's schema on the search path (our own tables are always named with their schema),
    statement and lock timeouts, and, for a read-only store, read-only transactions."""
    extension_schema: list[str] = []

    def setup(conn: Connection) -> None:
        if not extension_schema:
            extension_schema.append(ensure_extension(conn, create=not read_only)[0])
        conn.execute(
            "SELECT set_config('search_path', quote_ident(%s), false), "
            "set_config('statement_timeout', %s, false), "
            "set_config('lock_timeout', %s, false), "
            "set_config('default_transaction_read_only', %s, false)",
            (
                extension_schema[0],
                str(statement_timeout_ms),
                str(statement_timeout_ms),
                "on" if read_only else "off",
            ),
        )
        register_vector(conn)

    return setup


def ensure_extension(conn: Connection, *, create: bool = True) -> tuple[str, tuple[int, ...]]:
    """The schema and version of the `vector` extension, creating it when allowed (`create`:
    not for a read-only store, which creates nothing)."""
    found = extension(conn)
    if found is not None:
        return found
    if not create:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the pgvector extension is not installed in this database, so it holds no store to "
            "open read-only: check store.postgresDsn, or open the store writable once first.",
            reason=StoreUnavailableReason.PGVECTOR_MISSING,
        )
    try:
        with transaction(conn):
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s)", (lock_key("retrieval-host-extension"),)
            )
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "the pgvector extension is not installed in this database and this role may not "
            "create it; run CREATE EXTENSION vector once as an administrator.",
            reason=StoreUnavailableReason.PGVECTOR_MISSING,
        ) from exc
    found = extension(conn)
    if found is None:  # pragma: no cover - CREATE EXTENSION succeeded
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE,
            "pgvector is not available.",
            reason=StoreUnavailableReason.PGVECTOR_MISSING,
        )
    return found


# --- the vector store's tables ----------------------------------------------------------

# Expected shape of our tables (column -> udt name); anything else is not ours.
VECTOR_TABLES: Final[Mapping[str, Mapping[str, str]]] = {
    "corpora": {
        "corpus_id": "text",
        "descriptor_json": "text",
        "dimensions": "int4",
        "payload_bytes": "int8",
    },
    "sources": {
        "id": "int8",
        "corpus_id": "text",
        "namespace": "text",
        "source_id": "text",
        "revision": "text",
        "title": "text",
        "metadata_json": "text",
        "metadata": "jsonb",
        "document_sha256": "text",
        "fingerprint": "text",
        "chunk_count": "int8",
        "payload_bytes": "int8",
        "media_type": "text",
        "indexed_at": "text",
    },
    "chunks": {
        "id": "int8",
        "source_pk": "int8",
        "corpus_id": "text",
        "namespace": "text",
        "chunk_id": "text",
        "ordinal": "int8",
        "text": "text",
        "page": "int8",
        "start_line": "int8",
        "end_line": "int8",
        "document_id": "text",
        "dimensions": "int4",
        "embedding": "vector",
        "term_count": "int4",
    },
    "lexical_spaces": {
        "id": "int8",
        "corpus_id": "text",
        "namespace": "text",
        "passages": "int8",
        "total_terms": "int8",
    },
    "chunk_terms": {"space_pk": "int8", "term": "text", "chunk_pk": "int8", "tf": "int4"},
}

_VECTOR_DDL_V1: Final = (
    """CREATE TABLE {s}.corpora (
        corpus_id text PRIMARY KEY,
        descriptor_json text NOT NULL,
        dimensions integer NOT NULL CHECK (dimensions BETWEEN 1 AND 16384),
        payload_bytes bigint NOT NULL DEFAULT 0 CHECK (payload_bytes >= 0)
    )""",
    """CREATE TABLE {s}.sources (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        corpus_id text NOT NULL REFERENCES {s}.corpora (corpus_id),
        namespace text NOT NULL,
        source_id text NOT NULL,
        revision text NOT NULL,
        title text NOT NULL,
        metadata_json text NOT NULL,
        metadata jsonb NOT NULL,
        document_sha256 text NOT NULL,
        fingerprint text NOT NULL,
        chunk_count bigint NOT NULL,
        payload_bytes bigint NOT NULL,
        CONSTRAINT sources_source_key UNIQUE (corpus_id, namespace, source_id)
    )""",
    """CREATE TABLE {s}.chunks (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        source_pk bigint NOT NULL REFERENCES {s}.sources (id) ON DELETE CASCADE,
        corpus_id text NOT NULL,
        namespace text NOT NULL,
        chunk_id text NOT NULL,
        ordinal bigint NOT NULL,
        text text NOT NULL,
        page bigint,
        start_line bigint,
        end_line bigint,
        document_id text,
        dimensions integer NOT NULL,
        embedding vector NOT NULL CHECK (vector_dims(embedding) = dimensions),
        CONSTRAINT chunks_chunk_id_key UNIQUE (corpus_id, namespace, chunk_id),
        CONSTRAINT chunks_ordinal_key UNIQUE (source_pk, ordinal)
    )""",
)

# The lexical index (schema version 2). `chunks.term_count` is the passage's length in terms
# (NULL: not analyzed, only for passages a version-1 replica wrote after the migration).
# `lexical_spaces`: one row per corpus namespace with its passage count and total length,
# updated in the writing transaction. `chunk_terms`: per passage, its terms and their counts;
# its primary key serves both the df count and the postings of a term in a namespace.
_LEXICAL_DDL: Final = (
    "ALTER TABLE {s}.chunks ADD COLUMN term_count integer",
    """CREATE TABLE {s}.lexical_spaces (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        corpus_id text NOT NULL REFERENCES {s}.corpora (corpus_id),
        namespace text NOT NULL,
        passages bigint NOT NULL DEFAULT 0 CHECK (passages >= 0),
        total_terms bigint NOT NULL DEFAULT 0 CHECK (total_terms >= 0),
        CONSTRAINT lexical_spaces_key UNIQUE (corpus_id, namespace)
    )""",
    """CREATE TABLE {s}.chunk_terms (
        space_pk bigint NOT NULL REFERENCES {s}.lexical_spaces (id),
        term text COLLATE "C" NOT NULL,
        chunk_pk bigint NOT NULL REFERENCES {s}.chunks (id) ON DELETE CASCADE,
        tf integer NOT NULL CHECK (tf > 0),
        PRIMARY KEY (space_pk, term, chunk_pk)
    )""",
    "CREATE INDEX chunk_terms_chunk ON {s}.chunk_terms (chunk_pk)",
)
# Schema version 3: each source's media type and commit time. NULL for the sources a
# version-2 (or older) schema holds, and the listings show them as unknown.
_SOURCE_RECORD_DDL: Final = (
    "ALTER TABLE {s}.sources ADD COLUMN media_type text",
    "ALTER TABLE {s}.sources ADD COLUMN indexed_at text",
)
# Schema version 4: the media type of those sources, when ingested, read back from the
# metadata ingestion wrote it into (`media_types`; data only: a new schema has nothing to fill).
VECTOR_DDL: Final = (*_VECTOR_DDL_V1, *_LEXICAL_DDL, *_SOURCE_RECORD_DDL)
VECTOR_MIGRATIONS: Final[Mapping[int, Sequence[MigrationStep]]] = {
    1: _LEXICAL_DDL,
    2: _SOURCE_RECORD_DDL,
    3: (fill_media_types,),
}


def ensure_vector_schema(
    conn: Connection,
    schema: str,
    backfill: Callable[[Connection, int], None] | None = None,
    *,
    migrate: bool = True,
    read_only: bool = False,
) -> None:
    """`ensure_schema_component` for the vector store's tables (created when missing, unless
    `read_only`): the store's open and the start's read-only check (`catalog`) ask alike."""
    ensure_schema_component(
        conn,
        schema,
        VECTOR_COMPONENT,
        VECTOR_SCHEMA_VERSION,
        VECTOR_TABLES,
        VECTOR_DDL,
        VECTOR_MIGRATIONS,
        backfill,
        migrate=migrate,
        create=True,
        read_only=read_only,
    )


# Binary COPY column types of `chunks`, in the order `replace_source` writes them.
COPY_TYPES: Final = "int8 text text text int8 text int8 int8 int8 text int4 vector int4".split()
TERM_COPY_TYPES: Final = "int8 text int8 int4".split()


def ensure_hnsw_index(conn: Connection, schema: str, dims: int) -> None:
    """Build the partial HNSW index for one dimension once, whichever replica gets there.

    CREATE INDEX CONCURRENTLY keeps writes going during the build; replicas take turns
    with a *try* lock (no transaction is held while waiting, which CONCURRENTLY would
    otherwise wait for). An index left invalid by an interrupted build is rebuilt.
    """
    if dims > HNSW_MAX_DIMENSIONS:
        _log.warning(
            "no HNSW index for %d dimensions (pgvector indexes up to %d); exact search",
            dims,
            HNSW_MAX_DIMENSIONS,
        )
        return
    name = f"chunks_hnsw_{dims}"
    key = lock_key("retrieval-host-hnsw", schema, name)
    deadline = time.monotonic() + HNSW_BUILD_WAIT_S
    with translated("building the HNSW index"):
        while True:
            if _index_state(conn, schema, name) == "valid":
                return
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if row is not None and row[0]:
                break
            if time.monotonic() > deadline:
                raise RetrievalError(
                    ErrorCode.STORE_UNAVAILABLE,
                    "another replica has been building the HNSW index for too long.",
                    reason=StoreUnavailableReason.INDEX_BUILD,
                )
            time.sleep(0.2)  # another replica is building it
        # The session's own statement timeout (`session_setup`), put back after the build:
        # RESET goes to the server's default, which left this pooled connection with none (a
        # review).
        saved = conn.execute("SELECT current_setting('statement_timeout')").fetchone()
        try:
            state = _index_state(conn, schema, name)
            if state == "invalid":
                conn.execute(
                    sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {s}.{i}").format(
                        s=sql.Identifier(schema), i=sql.Identifier(name)
                    )
                )
            if state != "valid":
                _log.info("building the HNSW index %s.%s", schema, name)
                conn.execute("SET statement_timeout = 0")
                conn.execute(
                    sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(HNSW_BUILD_MEMORY))
                )
                with unbounded(conn):  # minutes on a large table
                    conn.execute(
                        sql.SQL(
                            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {i} ON {s}.chunks "
                            "USING hnsw ((embedding::vector({d})) vector_cosine_ops) "
                            "WITH (m = 16, ef_construction = 64) WHERE dimensions = {d}"
                        ).format(
                            i=sql.Identifier(name),
                            s=sql.Identifier(schema),
                            d=sql.Literal(dims),
                        )
                    )
        finally:
            conn.execute("RESET maintenance_work_mem")
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false)",
                (str(saved[0]) if saved is not None else "0",),
            )
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _index_state(conn: Connection, schema: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_index i ON i.indexrelid = c.oid WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    if row is None:
        return None
    return "valid" if row[0] else "invalid"

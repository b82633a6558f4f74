"""Adapters chosen in one place: the vector store, run records, generation providers and
rerankers that a host configuration names. Application factories call these, then add their
own authorizer."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol

import httpx

from retrieval_host.adapters._openai_http import malformed_key
from retrieval_host.adapters._store_rules import check_descriptor
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.adapters.provider_openai import OpenAIChatProvider
from retrieval_host.adapters.rerank_http import HttpReranker
from retrieval_host.core.corpus import Corpus
from retrieval_host.core.descriptor import RerankDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import VectorStore
from retrieval_host.core.run_ports import GenerationProvider, RunStore
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.service import RetrievalService
from retrieval_host.core.usage import UsageLog
from retrieval_host.settings import (
    HostSettings,
    OpenAIProviderSettings,
    RerankerSettings,
    SettingsError,
    is_loopback,
)

# False while an operator's command builds its driver (`without_migration`).
_MIGRATING: ContextVar[bool] = ContextVar("retrieval_host_migrating", default=True)


@contextlib.contextmanager
def without_migration() -> Iterator[None]:
    """Stores built meanwhile (by these functions, whatever factory calls them) refuse a
    schema of an earlier release rather than migrate it, and still create a new one: an
    operator's command (`ingest`) run from an updated venv must not change the format under
    the release still serving the store (it then failed its next start: a black-box test)."""
    token = _MIGRATING.set(False)
    try:
        yield
    finally:
        _MIGRATING.reset(token)


def build_vector_store(settings: HostSettings, environ: Mapping[str, str]) -> VectorStore:
    """SQLite at `store.sqlitePath`, or PostgreSQL + pgvector at `store.postgresDsn`."""
    store = settings.store
    migrate = _MIGRATING.get()
    if store.postgres_dsn is not None:
        from retrieval_host.adapters.postgres import PgVectorStore

        return PgVectorStore.open(
            _postgres_dsn(settings, environ),
            schema=store.postgres_schema,
            hnsw=store.hnsw,
            ef_search=store.ef_search,
            pool_size=store.pool_size,
            read_only=store.read_only,
            migrate=migrate,
        )
    if store.sqlite_path is None:
        raise RetrievalError(
            ErrorCode.STORE_UNAVAILABLE, "set store.sqlitePath or store.postgresDsn."
        )
    from retrieval_host.adapters.sqlite import SqliteVectorStore

    return SqliteVectorStore.open(
        settings.path(store.sqlite_path),
        trusted_groups=_trusted_groups(settings),
        read_only=store.read_only,
        snapshots=store.index_snapshots,
        approximate_min_rows=store.approximate_min_rows,
        migrate=migrate,
    )


def check_vector_store(
    settings: HostSettings, environ: Mapping[str, str], corpora: Sequence[Corpus]
) -> None:
    """Raise what opening the configured vector store and `corpora` in it would (`UNSAFE_STORE`
    for another application's or a newer release's store, `DESCRIPTOR_MISMATCH` for a corpus
    configured unlike the one stored), reading without writing: a start must refuse before
    the store or the run records are migrated, which the release that wrote them then refuses
    (probe U). `corpora`'s stores are not used. Nothing to check for a read-only store (its
    open writes nothing) or under `without_migration` (nothing is migrated)."""
    store = settings.store
    if store.read_only or not _MIGRATING.get():
        return
    if store.postgres_dsn is not None:
        from retrieval_host.adapters.postgres.catalog import peek_descriptors as peek_pg

        stored = peek_pg(_postgres_dsn(settings, environ), store.postgres_schema)
    elif store.sqlite_path is not None:
        from retrieval_host.adapters.sqlite.catalog import peek_descriptors

        stored = peek_descriptors(settings.path(store.sqlite_path), _trusted_groups(settings))
    else:
        return  # the open says what is missing
    for corpus in corpora:
        found = stored.get(corpus.id)
        if found is not None:
            check_descriptor(corpus.resolved(found).descriptor, found)


def _postgres_dsn(settings: HostSettings, environ: Mapping[str, str]) -> str:
    assert settings.store.postgres_dsn is not None
    dsn = settings.store.postgres_dsn.resolve(environ, settings.config_dir).get_secret_value()
    if not dsn.strip():
        # libpq reads an empty DSN as "the local socket, as the process's user": the error was
        # a connection failure to a server nobody named.
        raise SettingsError("store.postgresDsn: the secret is empty (its file or variable)")
    return dsn


class RecordStore(RunStore, UsageLog, Protocol):
    """Both run stores: run records, the usage log, pruning them, and closing."""

    def prune(self, before: str, *, usage: bool = False) -> tuple[int, int]: ...

    def close(self) -> None: ...


def build_run_store(
    settings: HostSettings, environ: Mapping[str, str], *, migrate: bool | None = None
) -> RecordStore:
    """Run records beside the passages: the same PostgreSQL database (so a replay works on any
    replica), or a SQLite file (`runs.sqlitePath`, default `runs.db` beside the store).
    `migrate=False` (the report commands): a store of an earlier schema, or none, is refused.
    None: migrated and created, except under `without_migration` (refused, created)."""
    store = settings.store
    create = migrate
    if migrate is None:
        migrate, create = _MIGRATING.get(), True
    # A read-only PostgreSQL store with `runs.sqlitePath` (a hot standby takes no writes): the
    # run records in that SQLite file, this replica's own.
    if store.postgres_dsn is not None and settings.runs.sqlite_path is None:
        from retrieval_host.adapters.postgres import PgRunStore

        return PgRunStore.open(
            _postgres_dsn(settings, environ),
            schema=store.postgres_schema,
            lease_s=settings.runs.lease_s,
            migrate=migrate,
            create=create,
        )
    from retrieval_host.adapters.sqlite import SqliteRunStore

    return SqliteRunStore.open(
        sqlite_runs_path(settings),
        trusted_groups=_trusted_groups(settings),
        lease_s=settings.runs.lease_s,
        migrate=migrate,
        create=create,
    )


def sqlite_runs_path(settings: HostSettings) -> Path:
    """The SQLite file of the run and usage records (`runs.sqlitePath`, default `runs.db`
    beside the store)."""
    path = settings.runs.sqlite_path
    if path is None:
        if settings.store.sqlite_path is None:
            # The store first: `"store": {}` was told "set runs.sqlitePath.", which would still
            # leave the host without a vector store (probe O, session 40).
            raise RetrievalError(
                ErrorCode.STORE_UNAVAILABLE,
                "set store.sqlitePath or store.postgresDsn (or runs.sqlitePath for the run "
                "records alone).",
            )
        path = settings.path(settings.store.sqlite_path).parent / "runs.db"
    return settings.path(path)


def _trusted_groups(settings: HostSettings) -> frozenset[int]:
    """The groups allowed to write to the SQLite files' directory (`store.trustOwnGroup`)."""
    from retrieval_host.adapters.sqlite.files import own_groups

    return own_groups() if settings.store.trust_own_group else frozenset()


def build_providers(
    settings: HostSettings, environ: Mapping[str, str]
) -> dict[str, GenerationProvider]:
    providers: dict[str, GenerationProvider] = {}
    for name, config in settings.providers.items():
        if isinstance(config, OpenAIProviderSettings):
            providers[name] = _openai(settings, config, environ)
        else:
            providers[name] = ExtractiveProvider()
    return providers


def _hosted_access(
    settings: HostSettings,
    config: OpenAIProviderSettings | RerankerSettings,
    environ: Mapping[str, str],
) -> tuple[Callable[[], str] | None, bool | ssl.SSLContext]:
    """A hosted service's key (a callable over the resolved secret; None: no key) and what
    its client verifies TLS with (the configured CA bundle, else the system's).

    A key is sent in clear only where the operator said so: plain `http://` to another
    machine than this one needs `allowPlainHttp` (a service mesh's encrypted sidecar, a
    trusted network), else the host refuses to start. The client refuses the same."""
    secret, ca_file = config.api_key, config.ca_file
    try:
        host = httpx.URL(config.base_url).host
    except httpx.InvalidURL:
        raise SettingsError(f"baseUrl: {config.base_url!r} is not a valid URL") from None
    plain = config.base_url.startswith("http://") and not is_loopback(host)
    if secret is not None and plain and not config.allow_plain_http:
        raise SettingsError(
            f"baseUrl: http://{host} would receive the API key in clear; use https, a "
            "loopback address, or set allowPlainHttp: true"
        )
    key = None if secret is None else secret.resolve(environ, settings.config_dir)
    if key is not None and malformed_key(key.get_secret_value()):
        # Every call would fail `api-key-unavailable` on a host that started healthy (a file
        # ending in a blank line, a black-box test): refused here, the value never echoed.
        raise SettingsError(
            f"apiKey of {config.base_url}: the key is empty or holds white space or a control "
            "character (a blank line at the end of its file?)"
        )
    verify: bool | ssl.SSLContext = True
    if ca_file is not None:
        path = settings.path(ca_file)
        try:
            verify = ssl.create_default_context(cafile=str(path))
        except (OSError, ssl.SSLError) as exc:  # SSLError: not a PEM bundle of certificates
            reason = exc.strerror if not isinstance(exc, ssl.SSLError) else exc.reason or exc
            raise SettingsError(f"caFile: cannot use {path} as a CA bundle: {reason}") from None
    return (None if key is None else key.get_secret_value), verify


def _openai(
    settings: HostSettings, config: OpenAIProviderSettings, environ: Mapping[str, str]
) -> OpenAIChatProvider:
    api_key, verify = _hosted_access(settings, config, environ)
    return OpenAIChatProvider(
        base_url=config.base_url,
        api_key=api_key,
        timeout_s=config.timeout_s,
        verify=verify,
        max_output_tokens=config.max_output_tokens,
        account_id=config.account_id,
    )


def build_reranker(
    settings: HostSettings, config: RerankerSettings, environ: Mapping[str, str]
) -> HttpReranker:
    """The `/rerank` adapter of `config`; its key is read from the secret reference."""
    api_key, verify = _hosted_access(settings, config, environ)
    descriptor = RerankDescriptor(
        provider_id="rerank-http",
        vendor=config.vendor,
        account_id=config.account_id,
        auth_mode="none" if api_key is None else "api-key",
        model=config.model,
    )
    return HttpReranker(
        descriptor=descriptor,
        base_url=config.base_url,
        api_key=api_key,
        timeout_s=config.timeout_s,
        verify=verify,
    )


def build_run_engine(
    settings: HostSettings,
    environ: Mapping[str, str],
    retrieval: RetrievalService | None,
    *,
    store: RecordStore | None = None,
) -> RunEngine | None:
    """The run engine, or None when the configuration names no provider. `store`: the run
    records already opened (`build_run_store`), else they are opened here."""
    providers = build_providers(settings, environ)
    if not providers:
        if store is not None:
            store.close()
        return None
    store = store if store is not None else build_run_store(settings, environ)
    # The run store is also the usage sink (`core.usage`): runs, searches and ingests record there.
    return RunEngine(retrieval, providers, store, usage=store)

"""A file-based authorizer over the store's committed revisions: the template for a real app.

The host never decides which sources a subject may read: the application does, through the
`authorize` callable of each corpus. This module is a small, complete example of
that contract, and the one example application factory (`create_driver`, below): the
quickstart, `config/host.example.json`, the deploy files and the tests all use it.

- `FileAcl` reads a JSON file mapping each subject to a namespace and, per operation, the
  source ids it may touch (`"*"` = every source). It is re-read when the file changes, so an
  operator can revoke access without a restart.
- The current revision of each source is read from the vector store itself
  (`VectorStore.current_revisions`), the one place a revision is committed.

Grants follow the store: a search is granted each allowed source at its *current* committed
revision (a stale revision is never searchable), a delete only that revision, and an index any
revision (`ANY_REVISION`, the ingestion helper derives revisions from content).

Why the store and not a registry of its own. Earlier versions kept the revisions in a JSON
registry updated by `Corpus.on_committed` after each commit. A writer killed between the
store's commit and that update (kill -9, OOM, power loss) left the registry one revision behind
the store: the source was unsearchable (the grant named a revision the store no longer held)
and undeletable (404 for the new revision, 409 for the old) until someone re-indexed it —
11 of 30 kill -9 trials with three writers (issue 13). No ordering of two separate durable
writes closes that window, and reconciling at start would not heal a host that keeps running
while another process (`retrieval-host ingest`, a replica) dies mid-write. Reading the store
closes it everywhere: the answer is the committed state, whoever committed it. It stays cheap
on the search path: SQLite answers from its in-memory index after the one-row freshness check a
search makes anyway (authorizing was a file `stat` and a copy of the registry before);
PostgreSQL runs one statement over the sources' unique index. The `registryFile` option of
earlier configurations is accepted and ignored; a `registry.json` it left behind can be deleted.

What remains an application's job: revisions it wants to *hold back* (e.g. publish only after
review) need its own record, and that record must be reconciled from
`VectorStore.current_revisions` whenever it opens, since `on_committed` can be lost with the
process that committed. In a real application the ACL is a table in its own database, and the
subject → permission lookup is whatever it already uses for its documents.

ACL file:

    {"subjects": {"alice": {"namespace": "team-a",
                            "search": ["*"], "index": ["handbook"], "delete": []}}}
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from pydantic import ValidationError

from retrieval_host.access_files import shared_access_file
from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.rerank_http import HttpReranker
from retrieval_host.adapters.wiring import (
    RecordStore,
    build_providers,
    build_reranker,
    build_run_store,
    build_vector_store,
    check_vector_store,
)
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import check_label
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant, VectorStore
from retrieval_host.core.rerank import RerankSettings
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.core.waits import locked
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.settings import HostSettings, RerankerSettings, SettingsError
from retrieval_host.unique_json import load_unique_json

ALL_SOURCES: Final = "*"

_log = logging.getLogger(__name__)


CurrentRevisions = Callable[[str, str, Collection[str] | None], Mapping[str, str]]
"""`(corpus, namespace, source_ids or None) -> {sourceId: revision}`, committed state: the
store's `VectorStore.current_revisions`."""


@dataclass(frozen=True, slots=True)
class SubjectAccess:
    namespace: str
    search: frozenset[str]
    index: frozenset[str]
    delete: frozenset[str]

    def allowed(self, operation: str) -> frozenset[str]:
        return {"search": self.search, "index": self.index, "delete": self.delete}[operation]


_SUBJECT_KEYS: Final = frozenset({"namespace", "search", "index", "delete"})


def _parse_acl(data: Any) -> dict[str, SubjectAccess]:
    if not isinstance(data, dict) or not isinstance(data.get("subjects"), dict):
        raise ValueError('an ACL file is {"subjects": {SUBJECT: {...}}}')
    if set(data) != {"subjects"}:
        other = sorted(set(data) - {"subjects"})
        raise ValueError(f'unknown key {other[0]!r} (an ACL file holds only "subjects")')
    subjects: dict[str, SubjectAccess] = {}
    for subject, entry in data["subjects"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("namespace"), str):
            raise ValueError(f"ACL subject {subject!r} needs a namespace")
        unknown = sorted(set(entry) - _SUBJECT_KEYS)
        if unknown:
            # A typo (`serch`) granted nothing without a word (a black-box test).
            raise ValueError(
                f"ACL subject {subject!r}: unknown key {unknown[0]!r} (known: namespace, "
                "search, index, delete)"
            )
        lists = {}
        for op in ("search", "index", "delete"):
            ids = entry.get(op, [])
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ValueError(f"ACL subject {subject!r}: {op} must be a list of source ids")
            lists[op] = frozenset(ids)
        subjects[subject] = SubjectAccess(entry["namespace"], **lists)
    return subjects


class FileAcl:
    """An `Authorizer` over a JSON ACL file and the store's current revisions (module doc)."""

    def __init__(self, path: Path, revisions: CurrentRevisions) -> None:
        self.path = path
        self.revisions = revisions
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._subjects: dict[str, SubjectAccess] = {}

    def load(self) -> None:
        """Read the file now: `SettingsError` (one line) when it cannot be read or parsed. The
        factory calls it, so a host never starts with an ACL it cannot use."""
        try:
            self._read()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise SettingsError(f"applicationOptions.aclFile {self.path}: {reason}") from None

    def _read(self) -> dict[str, SubjectAccess]:
        st = self.path.stat()
        # The inode and its change time too: a file renamed over the old one may carry the
        # same size and modification time (deployments that normalize mtimes, `cp -p`), and
        # its grants must still be read.
        stamp = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
        # Another thread may be reading a changed file: a search on the event loop does not
        # wait for it (`core.waits`).
        with locked(self._lock, "the ACL file"):
            if stamp != self._stamp:
                # Anyone who can write it grants themselves every corpus (a chmod changes the
                # stamp's ctime, so it is checked again): fails closed, as a broken file does.
                shared = shared_access_file(self.path, "the ACL file")
                if shared is not None:
                    raise ValueError(shared)
                # A key twice (a stale entry above its replacement) is an error, as in
                # host.json: the file fails closed rather than grant whichever came last.
                text = self.path.read_text(encoding="utf-8")
                self._subjects = _parse_acl(load_unique_json(text))
                self._stamp = stamp
            return self._subjects

    def _access(self, subject: str) -> SubjectAccess | None:
        """The subject's entry; nobody's while the file cannot be read or parsed (an edit with
        a mistake in it must not leave the previous grants standing: it fails closed)."""
        try:
            subjects = self._read()
        except (OSError, ValueError) as exc:
            _log.error(
                "the ACL file %s cannot be used, every request is denied: %s", self.path, exc
            )
            with self._lock:
                self._stamp, self._subjects = None, {}
            return None
        return subjects.get(subject)

    def authorize(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        """Grant what `context.subject` may touch for this operation; None denies."""
        access = self._access(context.subject)
        if access is None:
            return None
        allowed = access.allowed(request.operation)
        if not allowed:
            return None
        everything = ALL_SOURCES in allowed
        ids = request.source_ids

        if request.operation == "index":
            # Index grants name only the requested sources, at any revision.
            return Grant(
                access.namespace,
                {s: ANY_REVISION for s in ids or () if everything or s in allowed},
            )
        # Ask the store only for what may be granted: the requested ids, the ACL's own list,
        # or (for "*") every source of the namespace. The answer is a fresh dict: no copy.
        if not everything:
            ids = tuple(allowed) if ids is None else tuple(s for s in ids if s in allowed)
        return Grant(access.namespace, self.revisions(request.corpus, access.namespace, ids))


def acl_file_content(subject: str, namespace: str) -> dict[str, Any]:
    """An ACL granting one subject every source of one namespace (the quickstart's)."""
    everything = [ALL_SOURCES]
    return {
        "subjects": {
            subject: {
                "namespace": namespace,
                "search": everything,
                "index": everything,
                "delete": everything,
            }
        }
    }


# `registryFile`, read by earlier versions, is accepted and ignored (see the module doc).
_OPTIONS: Final = frozenset(
    {
        "aclFile",
        "corpora",
        "indexVersion",
        "embeddingThreads",
        "queryArithmetic",
        "reranker",
        "registryFile",
    }
)


def _corpus_ids(corpora: object) -> list[str]:
    """`applicationOptions.corpora`, checked before anything opens: `SettingsError` (one line,
    exit 2) for anything but a list of corpus ids the service would accept."""
    if not isinstance(corpora, list) or not all(isinstance(c, str) for c in corpora):
        raise SettingsError("applicationOptions.corpora must be a list of corpus ids")
    ids = [str(c) for c in corpora]
    for corpus_id in ids:
        try:
            check_label("corpus id", corpus_id)
        except RetrievalError as exc:
            raise SettingsError(f"applicationOptions.corpora: {exc.detail}") from None
    return ids


def create_driver(settings: HostSettings, environ: Mapping[str, str] | None = None) -> Driver:
    """The example application factory: `retrieval_host.example_acl:create_driver`.

    `applicationOptions`: `aclFile` (a path relative to the config file), `corpora` (ids,
    default `["library"]`), `indexVersion` (default `passages-v1`), `embeddingThreads`
    (model runs at once, one core each; default the cores the host may use),
    `queryArithmetic` (`float32`, the default, or `int8`: search queries embedded in integers,
    ~2x less model time per query, vectors at cosine ~0.99 to the float32 ones) and `reranker`
    (a `/rerank` endpoint every corpus reranks with, `settings.RerankerSettings`; default
    none). One local embedding model and one store (`store.sqlitePath` or
    `store.postgresDsn`) serve every corpus; the store is also the
    record of current revisions (`registryFile` of earlier versions is ignored, see the
    module doc). The options, the ACL file, the reranker, the providers and the corpora's
    stored descriptors are checked before a store is migrated: a refusal of any of them leaves
    the stores as they were, for the release that wrote them.
    """
    options = settings.application_options
    environ = {} if environ is None else environ
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        # A misspelled `aclFile` read the default `acl.json` instead of the file named.
        raise SettingsError(
            f"applicationOptions: unknown option {', '.join(map(repr, unknown))} (the example "
            f"application reads {', '.join(sorted(_OPTIONS - {'registryFile'}))})"
        )
    corpora = _corpus_ids(options.get("corpora", ["library"]))
    threads = options.get("embeddingThreads")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise SettingsError("applicationOptions.embeddingThreads must be a positive integer")
    arithmetic = options.get("queryArithmetic", "float32")
    if arithmetic not in ("float32", "int8"):
        raise SettingsError("applicationOptions.queryArithmetic must be 'float32' or 'int8'")
    embedding = LocalEmbedding(
        threads=threads, query_arithmetic="int8" if arithmetic == "int8" else "float32"
    )
    try:
        embedding.check_query_arithmetic()
    except ValueError as exc:
        raise SettingsError(f"applicationOptions.queryArithmetic: {exc}") from None
    # Whatever can refuse the start is checked before a store opens: opening one migrates an
    # earlier release's schema, which that release then refuses, so a start refused after it
    # (an ACL key this release does not know, a provider key that is not set) left no way
    # back to it (probe U). The ACL is given the store's revisions once the store is open.
    acl = FileAcl(settings.path(str(options.get("aclFile", "acl.json"))), _no_store_yet)
    acl.load()
    with contextlib.ExitStack() as on_failure:
        reranker, rerank = _reranker(settings, environ)
        if reranker is not None:
            on_failure.callback(reranker.close)
        providers = build_providers(settings, environ)
        on_failure.callback(_close_each, providers.values())
        chunking = ChunkingSettings().as_identity()

        def configured(store: VectorStore) -> list[Corpus]:
            return [
                Corpus(
                    id=corpus_id,
                    version=str(options.get("indexVersion", "passages-v1")),
                    embedding=embedding,
                    store=store,
                    authorize=acl.authorize,
                    chunking=chunking,
                    reranker=reranker,
                    rerank=rerank,
                    query_embedding=embedding.queries,
                )
                for corpus_id in corpora
            ]

        # The check reads the corpora's identities only, never their store.
        check_vector_store(settings, environ, configured(cast(VectorStore, None)))
        store, records = _open_stores(settings, environ, on_failure, runs=bool(providers))
        acl.revisions = store.current_revisions
        service = RetrievalService(configured(store))
        # The run store is also the usage sink (`core.usage`): runs, searches and ingests
        # record there.
        runs = None if records is None else RunEngine(service, providers, records, usage=records)
        driver = Driver(service, runs=runs)
        on_failure.pop_all()  # the driver closes them from now on
    return driver


def _no_store_yet(
    corpus: str, namespace: str, source_ids: Collection[str] | None
) -> Mapping[str, str]:
    raise AssertionError("the ACL was asked for revisions before the store was open")


def _close_each(closables: Iterable[object]) -> None:
    for closable in closables:
        close = getattr(closable, "close", None)  # providers that hold connections
        if callable(close):
            close()


def _reranker(
    settings: HostSettings, environ: Mapping[str, str]
) -> tuple[HttpReranker | None, RerankSettings]:
    """`applicationOptions.reranker` as an adapter (None when not set) and the candidates it
    reranks; `SettingsError` naming the key that is wrong."""
    options = settings.application_options.get("reranker")
    if options is None:
        return None, RerankSettings()
    try:
        config = RerankerSettings.model_validate(options)
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        # Which key (a black-box test: "Field required" named none).
        raise SettingsError(
            f"applicationOptions.reranker{'.' + where if where else ''}: {first['msg']}"
        ) from None
    reranker = build_reranker(settings, config, environ)
    return reranker, RerankSettings(candidates=config.candidates)


def _open_stores(
    settings: HostSettings,
    environ: Mapping[str, str],
    on_failure: contextlib.ExitStack,
    *,
    runs: bool,
) -> tuple[VectorStore, RecordStore | None]:
    """The vector store and, when `runs`, the run records; each closed by `on_failure`.

    Run records first: a command that refuses them (`ingest` beside an earlier release's host)
    must do so before a corpus is created in the vector store (a black-box test found one
    written, with an analyzer the earlier host could not open). Unless the vector store is
    read-only: opening it writes nothing, and its refusal of an earlier release's schema
    (`STORE_READ_ONLY`) must come before the run records are migrated (probe U)."""

    def vectors() -> VectorStore:
        store = build_vector_store(settings, environ)
        on_failure.callback(store.close)
        return store

    def records() -> RecordStore | None:
        if not runs:
            return None
        store = build_run_store(settings, environ)
        on_failure.callback(store.close)
        return store

    if settings.store.read_only:
        store = vectors()
        return store, records()
    run_records = records()
    return vectors(), run_records

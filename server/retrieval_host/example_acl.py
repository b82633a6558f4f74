"""A file-based authorizer and revision registry: the template for a real application.

The host never decides which sources a subject may read: the application does, through the
`authorize` callable of each corpus (SPEC §3.2). This module is a small, complete example of
that contract, used by the quickstart and by `config/example_app.py`:

- `FileAcl` reads a JSON file mapping each subject to a namespace and, per operation, the
  source ids it may touch (`"*"` = every source). It is re-read when the file changes, so an
  operator can revoke access without a restart.
- `RevisionRegistry` is the application's record of the current revision of every source, a
  JSON file updated through `Corpus.on_committed` after each committed index or delete.

Grants follow the registry: a search is granted each allowed source at its *current*
registered revision (a stale revision is never searchable), a delete only the registered
revision, and an index any revision (`ANY_REVISION`, the ingestion helper derives revisions
from content). In a real application both files are tables in its own database, and the
subject → permission lookup is whatever it already uses for its documents.

ACL file:

    {"subjects": {"alice": {"namespace": "team-a",
                            "search": ["*"], "index": ["handbook"], "delete": []}}}

Registry file (written by this module): {"corpus": {"namespace": {"sourceId": "revision"}}}
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import CommitEvent, Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.settings import HostSettings
from retrieval_host.wiring import build_run_engine, build_vector_store

ALL_SOURCES: Final = "*"


def _write_json_atomically(path: Path, data: object) -> None:
    # Write a sibling temp file and rename it over the old one: readers (and a crash) see the
    # old file or the new one, never half of one.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RevisionRegistry:
    """The current revision of every source, per corpus and namespace, kept in a JSON file.

    Several processes may share the file (the host and `retrieval-host ingest`, or replicas):
    reads reload it when it changed, and each update is a read-modify-write under an
    exclusive lock on `<file>.lock`, written atomically.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int, int] | None = None
        self._data: dict[str, dict[str, dict[str, str]]] = {}

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._data = None, {}
            return
        # Every replacement is a new file: inode, size and times together tell a change.
        stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_size)
        if stamp != self._stamp:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            self._data = {
                corpus: {ns: dict(sources) for ns, sources in spaces.items()}
                for corpus, spaces in loaded.items()
            }
            self._stamp = stamp

    def current(self, corpus: str, namespace: str) -> dict[str, str]:
        """Source id → current revision in one namespace (a copy)."""
        with self._lock:
            self._reload()
            return dict(self._data.get(corpus, {}).get(namespace, {}))

    def record(self, event: CommitEvent) -> None:
        """`Corpus.on_committed`: follow a committed index or delete."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        with self._lock, open(lock_path, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            self._stamp = None  # under the lock, always start from the file as it is now
            self._reload()
            sources = self._data.setdefault(event.corpus, {}).setdefault(event.namespace, {})
            if event.operation == "index":
                sources[event.source_id] = event.revision
            elif sources.get(event.source_id) == event.revision:
                del sources[event.source_id]
            _write_json_atomically(self.path, self._data)
            self._stamp = None


@dataclass(frozen=True, slots=True)
class SubjectAccess:
    namespace: str
    search: frozenset[str]
    index: frozenset[str]
    delete: frozenset[str]

    def allowed(self, operation: str) -> frozenset[str]:
        return {"search": self.search, "index": self.index, "delete": self.delete}[operation]


def _parse_acl(data: Any) -> dict[str, SubjectAccess]:
    if not isinstance(data, dict) or not isinstance(data.get("subjects"), dict):
        raise ValueError('an ACL file is {"subjects": {SUBJECT: {...}}}')
    subjects: dict[str, SubjectAccess] = {}
    for subject, entry in data["subjects"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("namespace"), str):
            raise ValueError(f"ACL subject {subject!r} needs a namespace")
        lists = {}
        for op in ("search", "index", "delete"):
            ids = entry.get(op, [])
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ValueError(f"ACL subject {subject!r}: {op} must be a list of source ids")
            lists[op] = frozenset(ids)
        subjects[subject] = SubjectAccess(entry["namespace"], **lists)
    return subjects


class FileAcl:
    """An `Authorizer` over a JSON ACL file and a `RevisionRegistry` (see the module doc)."""

    def __init__(self, path: Path, registry: RevisionRegistry) -> None:
        self.path = path
        self.registry = registry
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._subjects: dict[str, SubjectAccess] = {}

    def _access(self, subject: str) -> SubjectAccess | None:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._subjects = _parse_acl(json.loads(self.path.read_text(encoding="utf-8")))
                self._stamp = stamp
            return self._subjects.get(subject)

    def authorize(self, request: AuthorizationRequest, context: RequestContext) -> Grant | None:
        """Grant what `context.subject` may touch for this operation; None denies."""
        access = self._access(context.subject)
        if access is None:
            return None
        allowed = access.allowed(request.operation)
        if not allowed:
            return None
        everything = ALL_SOURCES in allowed

        def permitted(source_id: str) -> bool:
            return everything or source_id in allowed

        if request.operation == "index":
            # Index grants name only the requested sources, at any revision.
            ids = request.source_ids or ()
            return Grant(access.namespace, {s: ANY_REVISION for s in ids if permitted(s)})
        current = self.registry.current(request.corpus, access.namespace)
        wanted: Mapping[str, str] = current
        if request.source_ids is not None:
            wanted = {s: current[s] for s in request.source_ids if s in current}
        return Grant(access.namespace, {s: r for s, r in wanted.items() if permitted(s)})


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


def create_driver(settings: HostSettings, environ: Mapping[str, str] | None = None) -> Driver:
    """The example application factory: `retrieval_host.example_acl:create_driver`.

    `applicationOptions`: `aclFile` and `registryFile` (paths relative to the config file),
    `corpora` (ids, default `["library"]`), `indexVersion` (default `passages-v1`) and
    `embeddingThreads` (default 1). One local embedding model and one SQLite store
    (`store.sqlitePath`) serve every corpus.
    """
    options = settings.application_options
    environ = {} if environ is None else environ
    registry = RevisionRegistry(settings.path(str(options.get("registryFile", "registry.json"))))
    acl = FileAcl(settings.path(str(options.get("aclFile", "acl.json"))), registry)
    corpora = options.get("corpora", ["library"])
    if not isinstance(corpora, list) or not all(isinstance(c, str) for c in corpora):
        raise ValueError("applicationOptions.corpora must be a list of corpus ids")
    threads = options.get("embeddingThreads", 1)
    embedding = LocalEmbedding(threads=threads if isinstance(threads, int) else 1)
    store = build_vector_store(settings, environ)
    chunking = ChunkingSettings().as_identity()
    service = RetrievalService(
        [
            Corpus(
                id=corpus_id,
                version=str(options.get("indexVersion", "passages-v1")),
                embedding=embedding,
                store=store,
                authorize=acl.authorize,
                chunking=chunking,
                on_committed=registry.record,
            )
            for corpus_id in corpora
            if isinstance(corpus_id, str)
        ]
    )
    return Driver(service, runs=build_run_engine(settings, environ, service))

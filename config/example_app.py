"""Example application module: the factory `retrieval-host serve` imports.

`config/host.example.json` names it as `"application": "example_app:create_driver"`; the
directory of the config file is importable, so this file can sit beside it. Copy it into your
own package and replace the authorizer with your application's permission model: the host
only authenticates tokens and checks their corpus grants, the authorizer decides which
sources (at which revisions) a subject may search, index or delete.

The pieces used here are a template (see `retrieval_host.example_acl`): a JSON ACL file
(subject -> namespace and source ids per operation), granted at the revisions the store has
committed (`VectorStore.current_revisions`): the store is the record of what is current, so a
writer killed between its commit and an application effect never leaves the two disagreeing.
An application that keeps its own record of revisions updates it in `Corpus.on_committed` and
reconciles it from `current_revisions` whenever it starts (that hook dies with its process).
"""

from __future__ import annotations

from collections.abc import Mapping

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.example_acl import FileAcl
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.settings import HostSettings
from retrieval_host.wiring import build_run_engine, build_vector_store


def create_driver(settings: HostSettings, environ: Mapping[str, str]) -> Driver:
    """Build the retrieval service once, at startup: stores open, model loaded.

    `environ` resolves secrets the configuration names (e.g. a PostgreSQL DSN or a provider
    key given as {"env": NAME}); nothing else should read the process environment."""
    options = settings.application_options
    store = build_vector_store(settings, environ)  # SQLite or PostgreSQL, from the config
    acl = FileAcl(settings.path(str(options["aclFile"])), store.current_revisions)
    library = Corpus(
        id="library",
        version="passages-v1",
        embedding=LocalEmbedding(threads=2),  # opt-in local CPU model, pinned weights
        store=store,
        authorize=acl.authorize,  # <- your application's permission check goes here
        chunking=ChunkingSettings().as_identity(),
    )
    service = RetrievalService([library])
    # Grounded runs with the providers the configuration names (none: no /v1/runs).
    return Driver(service, runs=build_run_engine(settings, environ, service))

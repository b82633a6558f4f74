"""Example application module: the factory `retrieval-host serve` imports.

`config/host.example.json` names it as `"application": "example_app:create_driver"`; the
directory of the config file is importable, so this file can sit beside it. Copy it into your
own package and replace the authorizer with your application's permission model: the host
only authenticates tokens and checks their corpus grants, the authorizer decides which
sources (at which revisions) a subject may search, index or delete.

The pieces used here are a template (see `retrieval_host.example_acl`): a JSON ACL file
(subject -> namespace and source ids per operation) and a registry of current revisions that
`Corpus.on_committed` keeps up to date after each committed index or delete.
"""

from __future__ import annotations

from collections.abc import Mapping

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver
from retrieval_host.example_acl import FileAcl, RevisionRegistry
from retrieval_host.ingest import ChunkingSettings
from retrieval_host.settings import HostSettings
from retrieval_host.wiring import build_run_engine, build_vector_store


def create_driver(settings: HostSettings, environ: Mapping[str, str]) -> Driver:
    """Build the retrieval service once, at startup: stores open, model loaded.

    `environ` resolves secrets the configuration names (e.g. a PostgreSQL DSN or a provider
    key given as {"env": NAME}); nothing else should read the process environment."""
    options = settings.application_options
    registry = RevisionRegistry(settings.path(str(options["registryFile"])))
    acl = FileAcl(settings.path(str(options["aclFile"])), registry)
    library = Corpus(
        id="library",
        version="passages-v1",
        embedding=LocalEmbedding(threads=2),  # opt-in local CPU model, pinned weights
        store=build_vector_store(settings, environ),  # SQLite or PostgreSQL, from the config
        authorize=acl.authorize,  # <- your application's permission check goes here
        chunking=ChunkingSettings().as_identity(),
        on_committed=registry.record,  # <- and your record of current revisions here
    )
    service = RetrievalService([library])
    # Grounded runs with the providers the configuration names (none: no /v1/runs).
    return Driver(service, runs=build_run_engine(settings, environ, service))

"""The SQLite adapters: the embedded vector store and the run store, one file each.

`vector_store` (the store), `schema` and `files` (opening a database safely, shared by both
stores), `tables` (the vector store's SQL), `segment` (the in-memory index), `scan` (the scan
kernel and its threads), `grant_cache` (copies of repeatedly searched grants), `run_store`.
"""

from retrieval_host.adapters.sqlite.run_store import SqliteRunStore
from retrieval_host.adapters.sqlite.vector_store import SqliteVectorStore

__all__ = ["SqliteRunStore", "SqliteVectorStore"]

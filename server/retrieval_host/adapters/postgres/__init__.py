"""The PostgreSQL adapters: several host replicas share one database.

`vector_store` (the pgvector store), `search` (its search path), `schema` (our tables, checked
or created, and the HNSW index), `pool` (connections and driver errors), `run_store`.
"""

from retrieval_host.adapters.postgres.run_store import PgRunStore
from retrieval_host.adapters.postgres.vector_store import PgVectorStore

__all__ = ["PgRunStore", "PgVectorStore"]

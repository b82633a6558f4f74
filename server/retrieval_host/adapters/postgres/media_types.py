"""The PostgreSQL vector store's media-type backfill, `vector-store` 3 -> 4 (a migration step
of `schema`): the media type of the sources an earlier release ingested before sources
recorded one, read back from the metadata ingestion wrote it into.

Which sources: `adapters._media_type_backfill` (every passage id the one ingestion derives for
it, a type the host ingests; the SQLite store decides by the same code). The previous main
decided by the ids' shape in SQL and so also typed prepared sources with ids of that shape
(probe U, session 42); a schema it migrated keeps what it set (a re-index through the index API
resets it to NULL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from psycopg import sql

from retrieval_host.adapters import _media_type_backfill as backfill
from retrieval_host.adapters.postgres.pool import Connection

_SOURCE_WINDOW: Final = (  # the last column: whether the source is a candidate
    "SELECT id, source_id, revision, metadata ->> 'mediaType', chunk_count, "
    "media_type IS NULL AND metadata ->> 'mediaType' = ANY(%s) "
    "FROM {s}.sources WHERE id > %s ORDER BY id LIMIT %s"
)
_PASSAGES: Final = (
    "SELECT source_pk, ordinal, chunk_id, text FROM {s}.chunks WHERE source_pk = ANY(%s)"
)
_RECORD: Final = "UPDATE {s}.sources SET media_type = %s WHERE id = %s"


def fill_media_types(conn: Connection, schema: str) -> None:
    """The backfill, inside the migration's transaction. Linear: it reads every source row
    and every candidate passage's text once (`_media_type_backfill.fill_media_types`); each
    statement is short (a window of sources, a batch of their passages), so the session's
    statement timeout holds."""
    kinds = list(backfill.INGESTED_MEDIA_TYPES)

    def named(template: str) -> sql.Composed:  # `schema.schema_sql`, which imports this module
        return sql.SQL(template).format(s=sql.Identifier(schema))

    def window(after: int, limit: int) -> backfill.Window:
        rows = conn.execute(named(_SOURCE_WINDOW), (kinds, after, limit)).fetchall()
        found = [
            backfill.Candidate(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]))
            for r in rows
            if r[5]
        ]
        return found, int(rows[-1][0]) if rows else None

    def passages(keys: Sequence[int]) -> list[backfill.Passage]:
        rows = conn.execute(named(_PASSAGES), (list(keys),)).fetchall()
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]

    def record(found: Sequence[tuple[str, int]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(named(_RECORD), found)

    backfill.fill_media_types(window, passages, record)

"""What both stores share for inspection: the columns they select and the rows' mapping.

Both select the same columns in the same order, so one mapping serves both. Passage text bytes
of a source are derived from its stored `payload_bytes` (text bytes plus 4 bytes per vector
component, `_store_rules.checked_replacement`), so no passage text is read to count them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from retrieval_host.core.inspection import PassageSummary, SourceSummary, SourceTotals
from retrieval_host.core.models import Location

# Sources are aliased `s`, passages `c`. Followed by the version of the write, spelled per store
# (`_store_rules.stored_source`).
LISTED_SOURCE_COLUMNS: Final = (
    "s.source_id, s.revision, s.title, s.metadata_json, s.chunk_count, s.payload_bytes, "
    "s.media_type, s.indexed_at, s.fingerprint"
)
TOTAL_COLUMNS: Final = (
    "COUNT(*), COALESCE(SUM(s.chunk_count), 0), COALESCE(SUM(s.payload_bytes), 0)"
)
# Followed by the text's byte length, spelled per database.
PASSAGE_COLUMNS: Final = "c.chunk_id, c.ordinal, c.page, c.start_line, c.end_line, c.document_id"
READ_PASSAGE_COLUMNS: Final = (
    "c.chunk_id, s.source_id, s.revision, c.text, c.page, c.start_line, c.end_line, "
    "c.document_id, s.document_sha256, s.metadata_json"
)
# Positions before every stored one: ordinals are non-negative, source ids non-empty.
FIRST_ORDINAL: Final = -1
FIRST_SOURCE_ID: Final = ""


def text_bytes(payload_bytes: int, passages: int, dimensions: int) -> int:
    return payload_bytes - passages * dimensions * 4


def listed_source(row: Sequence[Any], dimensions: int) -> SourceSummary:
    source_id, revision, title, metadata_json, chunk_count, payload, media_type = row[:7]
    indexed_at, fingerprint, version = row[7:]
    return SourceSummary(
        id=str(source_id),
        revision=str(revision),
        title=str(title),
        metadata=json.loads(str(metadata_json)),
        chunk_count=int(chunk_count),
        bytes=text_bytes(int(payload), int(chunk_count), dimensions),
        media_type=None if media_type is None else str(media_type),
        indexed_at=None if indexed_at is None else str(indexed_at),
        version=str(version),
        content=str(fingerprint),
    )


def totals(row: Sequence[Any], dimensions: int) -> SourceTotals:
    sources, passages, payload = (int(v) for v in row)
    return SourceTotals(sources, passages, text_bytes(payload, passages, dimensions))


def listed_passage(row: Sequence[Any]) -> PassageSummary:
    chunk_id, ordinal, page, start_line, end_line, document_id, size = row
    return PassageSummary(
        str(chunk_id),
        int(ordinal),
        Location(page, start_line, end_line, document_id),
        int(size),
    )

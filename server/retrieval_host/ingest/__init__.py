"""Ingestion helpers: PDF, Markdown, plain text, HTML and e-mail files into cited passages.

`prepare_document` turns the bytes of one file into a source revision and its passages;
`Driver.ingest_context` (in `retrieval_host.driver`, a floor above) indexes them through the
same atomic path as prepared passages; `retrieval_host.batch.ingest_paths`, above the Driver,
ingests many files resumably.
"""

from retrieval_host.core.validation import derived_chunk_id as chunk_id
from retrieval_host.ingest.document import PreparedDocument, prepare_document
from retrieval_host.ingest.settings import (
    CHUNKING_SCHEME,
    MEDIA_TYPES,
    ChunkingSettings,
    IngestLimits,
    media_type_for_path,
)

__all__ = [
    "CHUNKING_SCHEME",
    "MEDIA_TYPES",
    "ChunkingSettings",
    "IngestLimits",
    "PreparedDocument",
    "chunk_id",
    "media_type_for_path",
    "prepare_document",
]

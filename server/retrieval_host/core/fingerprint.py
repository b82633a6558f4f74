"""Content digests: the document SHA-256 and the revision fingerprint (content + provenance)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict

from retrieval_host.core.models import ChunkInput, SourceInfo


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def joined_text(chunks: Sequence[ChunkInput]) -> str:
    return "\n\n".join(c.text for c in chunks)


def revision_fingerprint(
    source: SourceInfo, chunks: Sequence[ChunkInput], document_sha256: str
) -> str:
    """Equal exactly when the revision's passages, their locations and its provenance are."""
    body = {
        "source": {
            "id": source.id,
            "revision": source.revision,
            "title": source.title,
            "metadata": source.metadata,
        },
        "documentSha256": document_sha256,
        "chunks": [{"id": c.id, "text": c.text, "location": asdict(c.location)} for c in chunks],
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

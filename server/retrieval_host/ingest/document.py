"""`prepare_document`: raw bytes of a supported type → a source revision and its passages.

Determinism is what makes re-ingestion cheap and safe: the same bytes with the same settings
always give the same revision, chunk ids, texts and locations, so indexing them again returns
`unchanged` before anything is embedded.

- `documentSha256` is the SHA-256 of the document's full extracted text (UTF-8): the Markdown
  or plain-text file, the HTML file's visible text line by line (`ingest.html`), the PDF's
  page texts joined by form feeds, or the messages' body texts joined by form feeds, after
  normalization (line breaks to LF, NUL dropped; see `_text.normalize_text`).
- The default revision is `sha256:` + the SHA-256 of the normalized content *as indexed*: that
  text digest plus the derived title and metadata, the media type and the chunking identity.
  Byte noise that changes nothing indexed (CRLF vs LF, a re-saved PDF) keeps the revision;
  anything that would change the stored revision (text, headers, attachment list, title)
  changes it, so a re-ingest never meets `SOURCE_CONFLICT` by accident.
- Chunk ids are `p` + 24 hex digits of SHA-256 over (source id, revision, ordinal, text):
  unique across the sources of a namespace, stable for the same content, and made of
  characters that are safe inside a `[source:ID]` citation marker.

Text inside a document is content: nothing in it is interpreted as an instruction, a setting
or a grant; parsing only ever reads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import ChunkInput, IndexRequest, JSONScalar, JSONValue, SourceInfo
from retrieval_host.core.reasons import InvalidDocumentReason, PayloadTooLargeReason
from retrieval_host.core.validation import (
    MAX_METADATA_BYTES,
    check_id,
    check_user_metadata,
    derived_chunk_id,
    json_bytes,
)
from retrieval_host.ingest._text import clip
from retrieval_host.ingest.chunking import Chunker, Extracted
from retrieval_host.ingest.email import extract_email
from retrieval_host.ingest.html import extract_html
from retrieval_host.ingest.markdown import extract_markdown
from retrieval_host.ingest.pdf import extract_pdf
from retrieval_host.ingest.plain_text import extract_plain_text
from retrieval_host.ingest.settings import (
    CHUNKING_SCHEME,
    EML,
    HTML,
    MARKDOWN,
    MBOX,
    MEDIA_TYPES,
    PDF,
    TEXT,
    ChunkingSettings,
    IngestLimits,
    invalid_document,
    normalize_media_type,
    too_large,
    unsupported_media_type,
)


@dataclass(frozen=True)
class PreparedDocument:
    """A source revision and its passages, ready for `index_context`."""

    source: SourceInfo
    chunks: tuple[ChunkInput, ...]
    document_sha256: str

    def index_request(self, corpus: str) -> IndexRequest:
        """The request that indexes this revision into `corpus`."""
        return IndexRequest(corpus, self.source, self.chunks, self.document_sha256)


DEFAULT_SETTINGS = ChunkingSettings()
DEFAULT_LIMITS = IngestLimits()


def prepare_document(
    data: bytes,
    media_type: str,
    *,
    source_id: str,
    revision: str | None = None,
    title: str | None = None,
    metadata: Mapping[str, JSONScalar] | None = None,
    token_counter: Callable[[Sequence[str]], list[int]],
    settings: ChunkingSettings = DEFAULT_SETTINGS,
    limits: IngestLimits = DEFAULT_LIMITS,
    cancel: CancelToken | None = None,
) -> PreparedDocument:
    """Parse `data` as `media_type` and cut it into passages (pure CPU work, no I/O).

    `token_counter` is the embedding model's own counter (`EmbeddingAdapter.count_tokens`);
    every passage has at most `settings.max_tokens` tokens by it. `revision` defaults to the
    content digest described in the module docstring; `title` defaults to the document's own
    (front matter or first H1, PDF info title, first message's subject). `metadata` (the
    caller's, `check_user_metadata`) is laid over what the document yields, key by key, and
    counts in the default revision. `cancel` is checked between pages, messages and counting
    batches.

    Raises `RetrievalError`: `UNSUPPORTED_MEDIA_TYPE`; `PAYLOAD_TOO_LARGE` with a reason
    (`bytes`, `pages`, `messages`, `mime-parts`, `mime-depth`, `header-bytes`, `html-bytes`,
    `pdf-resource-limit`, `passages`); `DOCUMENT_TOO_COMPLEX` with a reason
    (`pdf-content-stream`, `pdf-operators`, `passages-per-byte`, `html-elements`);
    `INVALID_DOCUMENT` with a reason (`empty-document`, `content-type-mismatch`,
    `pdf-encrypted`, `pdf-no-text-layer`, `pdf-malformed`, `markdown-not-utf8`,
    `text-not-utf8`, `email-malformed`); `INVALID_REQUEST` for a bad
    source id or revision; `CANCELLED`/`TIMEOUT` from `cancel`.
    """
    media = normalize_media_type(media_type)
    check_id("source id", source_id)
    if revision is not None:
        check_id("revision", revision)
    extracted = extract_document(data, media, title=title, limits=limits, cancel=cancel)
    return finish_document(
        extracted,
        media,
        input_bytes=len(data),
        source_id=source_id,
        revision=revision,
        title=title,
        metadata=metadata,
        token_counter=token_counter,
        settings=settings,
        limits=limits,
        cancel=cancel,
    )


def extract_document(
    data: bytes,
    media_type: str,
    *,
    title: str | None = None,
    limits: IngestLimits = DEFAULT_LIMITS,
    cancel: CancelToken | None = None,
) -> Extracted:
    """The first half of `prepare_document`: check the bytes and extract the text.

    This is the part that reads untrusted structure (pypdf, the MIME parser, BeautifulSoup);
    the host runs it in a parse worker process (`ingest.isolation`). `media_type` is already
    normalized (`normalize_media_type`, at the edge).
    """
    media = _normalized(media_type)
    if len(data) > limits.max_bytes:
        raise too_large(
            PayloadTooLargeReason.BYTES, f"the document is larger than {limits.max_bytes} bytes."
        )
    if not data.strip():
        raise invalid_document(InvalidDocumentReason.EMPTY_DOCUMENT, "the document is empty.")
    return _extract(data, media, title, limits, cancel)


def finish_document(
    extracted: Extracted,
    media_type: str,
    *,
    input_bytes: int,
    source_id: str,
    revision: str | None = None,
    title: str | None = None,
    metadata: Mapping[str, JSONScalar] | None = None,
    token_counter: Callable[[Sequence[str]], list[int]],
    settings: ChunkingSettings = DEFAULT_SETTINGS,
    limits: IngestLimits = DEFAULT_LIMITS,
    cancel: CancelToken | None = None,
) -> PreparedDocument:
    """The second half of `prepare_document`: cut the extracted text into passages (at most
    `limits.passage_allowance(input_bytes)`) and derive the revision and chunk ids.
    `media_type` is already normalized (`normalize_media_type`, at the edge)."""
    media = _normalized(media_type)
    check_id("source id", source_id)
    if revision is not None:
        check_id("revision", revision)
    chunker = Chunker(
        token_counter,
        settings,
        max_passages=limits.max_passages,
        allowance=limits.passage_allowance(input_bytes),
        cancel=cancel,
    )
    passages = chunker.passages(extracted.segments)
    if not passages:
        raise invalid_document(
            InvalidDocumentReason.EMPTY_DOCUMENT, "the document has no text to index."
        )

    document_sha256 = hashlib.sha256(extracted.text.encode("utf-8")).hexdigest()
    final_title = title if title is not None else clip(extracted.title, 1024)
    given = dict(metadata or {})
    check_user_metadata(given)
    merged = {**_fit_metadata(dict(extracted.metadata), json_bytes(given)), **given}
    if revision is None:
        identity: dict[str, JSONValue] = {
            "scheme": CHUNKING_SCHEME,
            "chunking": dict(settings.as_identity()),
            "mediaType": media,
            "documentSha256": document_sha256,
            "title": final_title,
            "metadata": merged,
        }
        if chunker.markup_left_out:
            # Its passages differ from an earlier release's (`Chunker.markup_left_out`): a new
            # default revision, so sending it again replaces them. Every other document keeps
            # its revision, and its passages are those it had.
            identity["markupOnlyPassages"] = "left out"
        revision = "sha256:" + _digest(identity)
    chunks = tuple(
        ChunkInput(
            derived_chunk_id(source_id, revision, ordinal, p.text), p.text, p.location, p.path
        )
        for ordinal, p in enumerate(passages)
    )
    return PreparedDocument(
        SourceInfo(source_id, revision, final_title, merged), chunks, document_sha256
    )


def _extract(
    data: bytes, media: str, title: str | None, limits: IngestLimits, cancel: CancelToken | None
) -> Extracted:
    if media == PDF:
        return extract_pdf(data, title, limits, cancel)
    if media == MARKDOWN:
        return extract_markdown(data, title)
    if media in (EML, MBOX):
        return extract_email(data, media, title, limits, cancel)
    if media == TEXT:
        return extract_plain_text(data, title)
    if media == HTML:
        return extract_html(data, title, limits, cancel)
    raise AssertionError(media)  # `_normalized` admits nothing else


def _normalized(media_type: str) -> str:
    # Normalized once at the edge; a caller that skipped it is refused, never re-normalized
    # here (the revision digest must see the one normalized value).
    if media_type not in MEDIA_TYPES:
        raise unsupported_media_type()
    return media_type


def _digest(value: JSONValue) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _fit_metadata(metadata: dict[str, JSONValue], reserved: int) -> dict[str, JSONValue]:
    """Last guard under core's metadata bound, `reserved` bytes kept for the caller's own
    metadata: growing lists give way first, flagged."""
    for key in ("sections", "messages", "frontMatter"):
        if json_bytes(metadata) <= MAX_METADATA_BYTES - 512 - reserved:
            break
        if key in metadata:
            metadata[key] = [] if key != "frontMatter" else {}
            metadata[f"{key}Truncated"] = True
    return metadata

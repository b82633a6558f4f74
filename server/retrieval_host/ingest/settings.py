"""Chunking settings (part of a corpus's identity), ingestion limits and the supported types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.passage_context import (
    CONTEXT_KEY,
    PassageContext,
    context_of,
    context_reserve_tokens,
)
from retrieval_host.core.reasons import (
    DescriptorMismatchReason,
    DocumentTooComplexReason,
    InvalidDocumentReason,
    InvalidRequestReason,
    PayloadTooLargeReason,
    UnsupportedMediaTypeReason,
)

PDF: Final = "application/pdf"
MARKDOWN: Final = "text/markdown"
EML: Final = "message/rfc822"
MBOX: Final = "application/mbox"
TEXT: Final = "text/plain"
HTML: Final = "text/html"

MEDIA_TYPES: Final[frozenset[str]] = frozenset({PDF, MARKDOWN, EML, MBOX, TEXT, HTML})

_SUFFIXES: Final[Mapping[str, str]] = {
    ".pdf": PDF,
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".eml": EML,
    ".mbox": MBOX,
    ".txt": TEXT,
    ".html": HTML,
    ".htm": HTML,
}

# The version of the whole passage-making procedure (extraction, normalization, splitting, ids).
# Any change that could move a passage boundary or an id bumps it, which changes the corpus
# identity: an existing corpus then refuses to open instead of mixing two schemes.
CHUNKING_SCHEME: Final = "rh-ingest/1"

MiB: Final = 1024 * 1024
KiB: Final = 1024


def media_type_for_path(path: Path) -> str:
    """The media type of a file by its suffix: .pdf .md/.markdown .eml .mbox .txt .html/.htm.

    Raises `UNSUPPORTED_MEDIA_TYPE` for any other suffix; the content is never sniffed, and
    `prepare_document` still checks that the bytes match the type.
    """
    media_type = _SUFFIXES.get(path.suffix.lower())
    if media_type is None:
        raise RetrievalError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "supported files are .pdf, .md, .markdown, .txt, .html, .htm, .eml and .mbox.",
            reason=UnsupportedMediaTypeReason.UNKNOWN_SUFFIX,
        )
    return media_type


def normalize_media_type(media_type: str) -> str:
    """The one normalization of a media type, made once where a document enters the host
    (`Driver.ingest_context`, the ingest route's Content-Type, `prepare_document`): the base
    type without parameters such as `; charset=utf-8`, in lower case, and supported.

    Everything past that edge (`extract_document`, `finish_document`, the parse worker) takes
    the normalized value as it is; the revision digest includes it.
    """
    base = media_type.split(";", 1)[0].strip().lower()
    if base not in MEDIA_TYPES:
        raise unsupported_media_type()
    return base


def unsupported_media_type() -> RetrievalError:
    """The one `UNSUPPORTED_MEDIA_TYPE` answer for a type the ingest helpers do not read."""
    return RetrievalError(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        "supported media types are " + ", ".join(sorted(MEDIA_TYPES)) + ".",
        reason=UnsupportedMediaTypeReason.UNSUPPORTED_MEDIA_TYPE,
    )


def _invalid_settings(detail: str) -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST, detail, reason=InvalidRequestReason.CHUNKING_SETTINGS
    )


@dataclass(frozen=True)
class ChunkingSettings:
    """How documents are cut into passages; part of the corpus identity.

    `max_tokens` is measured with the embedding model's own tokenizer, special tokens included,
    and must not exceed the model's `max_input_tokens` (the driver checks this), so no passage
    is ever silently truncated by the model. `overlap_tokens` is how much trailing text of a
    passage is repeated at the start of the next one within the same page, section or message;
    overlap is made of whole lines or sentences, so it can be shorter than asked (or empty when
    the last sentence alone is longer than the overlap).

    `context` (`core.passage_context`): with "title-sections", each passage is embedded and
    analyzed with its title and section path, and the chunker leaves
    `context_reserve_tokens(max_tokens)` of every passage free for them. The settings as a
    dataclass are concrete; the *configured* default ("auto": the stored corpus's choice, or
    "title-sections" for a new corpus) is `Corpus.chunking` without the key, decided by
    `resolve_chunking` when the corpus opens.
    """

    max_tokens: int = 256
    overlap_tokens: int = 32
    context: PassageContext = "none"

    def __post_init__(self) -> None:
        for name in ("max_tokens", "overlap_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _invalid_settings(f"{name} must be an integer.")
        if not 16 <= self.max_tokens <= 8192:
            raise _invalid_settings("max_tokens must be in 16..8192.")
        if not 0 <= self.overlap_tokens <= self.max_tokens // 2:
            raise _invalid_settings("overlap_tokens must be in 0..max_tokens/2.")
        if self.context not in ("none", "title-sections"):
            raise _invalid_settings("context must be none or title-sections.")

    @property
    def content_tokens(self) -> int:
        """Tokens of a passage's own text at most (`max_tokens` less the context's room)."""
        if self.context == "none":
            return self.max_tokens
        return self.max_tokens - context_reserve_tokens(self.max_tokens)

    def as_identity(self) -> dict[str, int | str]:
        """The settings as stored in the corpus descriptor (`Corpus(chunking=...)`); a context
        of "none" is no key at all, as in corpora made before passage context."""
        identity: dict[str, int | str] = {
            "scheme": CHUNKING_SCHEME,
            "max_tokens": self.max_tokens,
            "overlap_tokens": self.overlap_tokens,
        }
        if self.context != "none":
            identity[CONTEXT_KEY] = self.context
        return identity

    @classmethod
    def from_identity(cls, identity: Mapping[str, JSONScalar]) -> ChunkingSettings:
        """Rebuild the settings from a corpus's `chunking`; an empty mapping means defaults.

        A corpus chunked by another scheme is refused (`DESCRIPTOR_MISMATCH`): passages of two
        schemes in one index would cite inconsistently, and nothing is silently converted.
        """
        context = context_of(identity)
        if not set(identity) - {CONTEXT_KEY}:
            return cls(context=context)
        if "scheme" not in identity:
            # Written by hand (`{"max_tokens": 128}`), never by a chunker: it read "chunked by
            # another scheme" on a corpus nothing had been chunked into (probe I).
            raise _invalid_settings(
                f"the corpus's chunking {sorted(identity)} is not an ingestion identity: open "
                "it with ChunkingSettings(max_tokens=..., overlap_tokens=...).as_identity() "
                "(or {} for the defaults); as part of the corpus's identity it needs a new "
                "corpus id."
            )
        if identity.get("scheme") != CHUNKING_SCHEME or set(identity) - {CONTEXT_KEY} != {
            "scheme",
            "max_tokens",
            "overlap_tokens",
        }:
            raise RetrievalError(
                ErrorCode.DESCRIPTOR_MISMATCH,
                f"the corpus was chunked by another scheme than {CHUNKING_SCHEME}; "
                "rebuild it into a new corpus.",
                reason=DescriptorMismatchReason.CHUNKING_SCHEME,
            )
        max_tokens = identity["max_tokens"]
        overlap = identity["overlap_tokens"]
        if not isinstance(max_tokens, int) or not isinstance(overlap, int):
            raise _invalid_settings("chunking identity holds non-integer token counts.")
        return cls(max_tokens=max_tokens, overlap_tokens=overlap, context=context)


@dataclass(frozen=True)
class IngestLimits:
    """Bounds on one ingested document.

    Size bounds (`max_bytes` .. `max_header_bytes`) are `PAYLOAD_TOO_LARGE` with a `reason`.
    Work bounds, for inputs small on the wire but costly to parse or embed, are
    `DOCUMENT_TOO_COMPLEX` with a reason:

    - `max_content_stream_bytes`: decoded content-stream bytes of one PDF page
      (`pdf-content-stream`); real text pages hold 1-20 KiB, a vector-heavy one a few MiB;
    - `max_page_operators` / `max_document_operators`: content-stream operators of one page
      and of the whole PDF, estimated by a scan of the decoded stream before any text is
      extracted (`pdf-operators`). pypdf's extraction costs ~25 us per operator, so the
      defaults cap one page at ~2.5 s and a document at ~50 s of one core; measured real
      pages hold 50-1,100 (text) operators, a 500,000-operator page was the attack;
    - `passages_per_kib` passages per KiB of input, plus `min_passage_allowance`
      (`passages-per-byte`): a small input cannot make many passages to embed. Long passages
      are bounded by the input's size anyway (a 256-token passage needs ~300 bytes of text);
      what this stops is the flood of tiny ones, each costing the model a fixed ~3 ms.
      Measured on the bundled samples, 300 SciFact abstracts and 340 Markdown files installed
      with the host's dependencies: at most 4.8 passages per KiB (a model-card template of
      short sections; PDFs 0.3-1.1); a how-to of one-line steps under headings makes 28;
      `# a` repeated makes 256. 40 per KiB keeps every such real shape and costs at most
      ~2,400 passages (~7 s of embedding) for a 60 KB input;
    - `max_html_elements`: start tags of one HTML document (`html-elements`), counted while
      the stdlib tokenizer streams it (no tree is built). Measured on a 2-core CI-class
      machine: 199,000 bare `<b>` tags take 1.9 s, a 5.6 MB page of 99,000 short paragraphs
      6 s (the text, not the tags, dominates there); the tokenizer alone needs ~14 us per tag.
      Real pages hold far fewer: a large single-page manual has tens of thousands.

    They are checked as early as possible: bytes before parsing, the page count and the
    content streams before any text is extracted, message and MIME part counts before or
    while walking (never recursing without a bound), and passages while cutting, so a hostile
    file costs bounded work.
    """

    max_bytes: int = 32 * MiB
    max_pages: int = 2000
    max_messages: int = 5000
    max_mime_parts: int = 1000
    max_mime_depth: int = 16
    max_passages: int = 10_000
    max_header_bytes: int = 64 * KiB
    max_content_stream_bytes: int = 16 * MiB
    max_page_operators: int = 100_000
    max_document_operators: int = 2_000_000
    passages_per_kib: int = 40
    min_passage_allowance: int = 64
    max_html_elements: int = 200_000

    def passage_allowance(self, input_bytes: int) -> int:
        """How many passages an input of `input_bytes` may make (at most `max_passages`)."""
        return min(
            self.max_passages,
            self.min_passage_allowance + self.passages_per_kib * input_bytes // KiB,
        )

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RetrievalError(
                    ErrorCode.INVALID_REQUEST, f"{name} must be a positive integer."
                )


# `too_large` and `too_complex` take `str`: the driver and batch ingest still pass literals;
# `tests/core/test_reasons.py` holds every caller's literal to the code's enum.
def too_large(reason: PayloadTooLargeReason | str, detail: str) -> RetrievalError:
    """A `PAYLOAD_TOO_LARGE` error with its machine-readable reason."""
    return RetrievalError(ErrorCode.PAYLOAD_TOO_LARGE, detail, reason=reason)


def too_complex(reason: DocumentTooComplexReason | str, detail: str) -> RetrievalError:
    """A `DOCUMENT_TOO_COMPLEX` error: the document costs more work than allowed."""
    return RetrievalError(ErrorCode.DOCUMENT_TOO_COMPLEX, detail, reason=reason)


def invalid_document(reason: InvalidDocumentReason, detail: str) -> RetrievalError:
    """An `INVALID_DOCUMENT` error with its machine-readable reason."""
    return RetrievalError(ErrorCode.INVALID_DOCUMENT, detail, reason=reason)

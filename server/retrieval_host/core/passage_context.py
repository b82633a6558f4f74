"""What a passage is about, said in words it may not hold itself: its title and section path.

A passage is an exact slice of its document, and that stays what is stored and cited. But the
third passage of a long section holds neither the document's title nor the section's heading,
so neither the embedding model nor BM25 can tell what it is about. In a corpus whose chunking
identity says `"context": "title-sections"`, each passage is embedded and analyzed together
with a short *context line*: the source's title and the heading path of the section it lies in
(or, in an e-mail thread, the subject of its own message), parts the passage already opens
with left out. The passage text, its line range and its chunk id do not change.

The section path comes from the extractor (`ingest`): the heading path of a Markdown or HTML
section, the subject of an e-mail message; a PDF passage has its title only. An application
that indexes its own passages gives each one's `section_path` (`ChunkInput`), or none.

The context line is at most `MAX_CONTEXT_CHARS` characters. `embedding_text` puts it before the
passage; the service drops its last parts until the whole fits the embedding model's input (the
chunker leaves room for it, `context_reserve_tokens`, so this is rare), so a passage's own text
is never cut from its vector to make room for a title.

Corpora made before this existed have no `context` in their chunking identity and are read as
`"none"`: their passages keep being embedded and analyzed as before (`resolve_chunking`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal, TypeAlias, get_args

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.reasons import InvalidRequestReason

__all__ = [
    "CONTEXT_KEY",
    "DEFAULT_CONTEXT",
    "MAX_CONTEXT_CHARS",
    "PassageContext",
    "context_of",
    "context_reserve_tokens",
    "embedding_text",
    "lexical_text",
    "passage_context",
    "resolve_chunking",
    "shorter",
]

PassageContext: TypeAlias = Literal["none", "title-sections"]
CONTEXTS: Final[tuple[str, ...]] = get_args(PassageContext)
# The key in a chunking identity (`Corpus.chunking`, the descriptor's `chunking`).
CONTEXT_KEY: Final = "context"
# What a corpus created without saying gets; a corpus made before the key keeps "none".
DEFAULT_CONTEXT: Final[PassageContext] = "title-sections"
MAX_CONTEXT_CHARS: Final = 300
_SEPARATOR: Final = " > "
# A part the passage "already opens with" is one of its first lines (blank lines counted), `#`
# marks aside: a section's first passage opens with its heading lines.
_OPENING_LINES: Final = 8
_OPENING_CHARS: Final = 8 * 1024


def context_of(chunking: Mapping[str, JSONScalar]) -> PassageContext:
    """The passage context of a (resolved or stored) chunking identity; absent is "none"."""
    value = chunking.get(CONTEXT_KEY, "none")
    if value == "title-sections":
        return "title-sections"
    if value == "none":
        return "none"
    raise RetrievalError(
        ErrorCode.INVALID_REQUEST,
        f"chunking context must be one of {', '.join(CONTEXTS)}.",
        reason=InvalidRequestReason.CHUNKING_SETTINGS,
    )


def resolve_chunking(
    configured: Mapping[str, JSONScalar], stored: Mapping[str, JSONScalar] | None
) -> dict[str, JSONScalar]:
    """The chunking identity a corpus opens with, in its stored form.

    A configuration that names a `context` gets it (a stored corpus that differs is then a
    `DESCRIPTOR_MISMATCH`, as for any other field). One that does not takes the stored
    corpus's (absent there: "none", the corpora made before passage context), or
    `DEFAULT_CONTEXT` for a corpus that does not exist yet (`stored` None). "none" is stored
    as no key at all, so a corpus without context keeps the descriptor and the derived
    revisions it always had.
    """
    resolved = dict(configured)
    if CONTEXT_KEY in configured:
        chosen = context_of(configured)
    elif stored is None:
        chosen = DEFAULT_CONTEXT
    else:
        chosen = context_of(stored)
    resolved.pop(CONTEXT_KEY, None)
    if chosen != "none":
        resolved[CONTEXT_KEY] = chosen
    return resolved


def context_reserve_tokens(max_tokens: int) -> int:
    """Tokens the chunker keeps free in each passage for its context line: an eighth of the
    passage size, at most 32 (enough for a title and two headings of ordinary length)."""
    return min(32, max_tokens // 8)


def passage_context(title: str, section_path: Sequence[str], text: str) -> str:
    """The context line of one passage (empty when there is nothing to add): the title, then
    the section path, each part left out when an earlier part says it or when it is one of
    the passage's first lines (its heading)."""
    parts: list[str] = []
    opening = {
        _folded(line.lstrip("#")) for line in text[:_OPENING_CHARS].split("\n")[:_OPENING_LINES]
    }
    for part in (title, *section_path):
        part = _folded(part)
        if part and part not in parts and part not in opening:
            parts.append(part)
    line = _SEPARATOR.join(parts)
    if len(line) > MAX_CONTEXT_CHARS:
        line = line[:MAX_CONTEXT_CHARS].rsplit(" ", 1)[0]
    return line


def _folded(text: str) -> str:
    return " ".join(text.split())


def embedding_text(context: str, text: str) -> str:
    """What the embedding model reads for a passage: its context line, a blank line, the text."""
    return f"{context}\n\n{text}" if context else text


def lexical_text(context: str, text: str) -> str:
    """What the lexical analyzer reads for a passage (the stores' `StoredChunk.context`)."""
    return f"{context}\n{text}" if context else text


def shorter(context: str) -> str:
    """The context line a little shorter, tried when the whole does not fit the model's input:
    its last part cut to the first half of its words, and once that part is one word, left
    out (empty after the title). A long heading (a function's signature) keeps its first
    words, its name; it was left out whole, with the name (a black-box test)."""
    head, separator, last = context.rpartition(_SEPARATOR)
    words = last.split()
    if len(words) > 1:
        return f"{head}{separator}{' '.join(words[: len(words) // 2])}"
    return head

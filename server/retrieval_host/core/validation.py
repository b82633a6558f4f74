"""Shape checks on requests that every entry point (in-process or HTTP) goes through."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Final

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import (
    SEARCH_MODES,
    ChunkInput,
    IndexRequest,
    JSONValue,
    Location,
    Metadata,
    SearchRequest,
)
from retrieval_host.core.reasons import InvalidRequestReason

MAX_ID_CHARS = 256
MAX_QUERY_BYTES = 8192
MAX_LIMIT = 100
MAX_METADATA_BYTES = 16_384
# Containers inside containers, the outer object counting 1: a reply nests metadata a few
# levels down, and both the host's JSON parser and the client's stop near 200 levels (a
# black-box test stored metadata 300 deep in-process: every answer holding it was a 500).
MAX_METADATA_DEPTH = 32
MAX_SOURCE_IDS = 10_000


def _invalid(detail: str) -> RetrievalError:
    return RetrievalError(ErrorCode.INVALID_REQUEST, detail)


# Unicode category Cc: C0, DEL and C1. The wire schema's `IDENTIFIER_PATTERN` says the same.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
WILDCARD = "*"
# A lone surrogate: a `str` no UTF-8 can encode (a file name that is not UTF-8, decoded with
# `surrogateescape`). Every store, hash and tokenizer failed on one with its own raw error.
_SURROGATES = re.compile("[\ud800-\udfff]")
_NOT_UNICODE = "must be valid Unicode (it holds a lone surrogate, as a name that is not UTF-8 does)"


def check_id(kind: str, value: str) -> None:
    """The identifier rule (corpus, source id, revision, chunk id, filter key): 1-256
    characters, no control character (C0, DEL, C1), no surrounding whitespace, and not `*`
    alone, which grants read as "every source" or "any revision"."""
    if not isinstance(value, str):  # an in-process caller's bytes or number
        raise _invalid(f"{kind} must be text, not {type(value).__name__}.")
    if not value or len(value) > MAX_ID_CHARS or value != value.strip():
        raise _invalid(f"{kind} must be 1-{MAX_ID_CHARS} characters without surrounding spaces.")
    if _CONTROLS.search(value):
        raise _invalid(f"{kind} must not contain control characters.")
    if _SURROGATES.search(value):
        raise _invalid(f"{kind} {_NOT_UNICODE}.")
    if value == WILDCARD:
        raise _invalid(f"'{WILDCARD}' is a wildcard of grants, not a {kind}.")


# What a citation marker `[source:ID]` cannot hold: the chunk id is the passage's handle.
_NOT_IN_HANDLES = re.compile(r"[\s\[\]]")


def is_citation_handle(chunk_id: str) -> bool:
    """Whether a stored chunk id can be cited as `[source:ID]` (an earlier release stored ids
    with white space or brackets, which no marker can hold)."""
    return _NOT_IN_HANDLES.search(chunk_id) is None


def check_chunk_id(value: str) -> None:
    """The identifier rule, and no whitespace, `[` or `]`: a chunk id is the handle a model
    cites as `[source:ID]`, and a marker ends at the first of them (the wire schema's
    `CHUNK_ID_PATTERN`). Checked where passages are indexed; stored ids are read as they are."""
    check_id("chunk id", value)
    if not is_citation_handle(value):
        raise _invalid(
            "a chunk id is the passage's citation handle [source:ID]: it must not contain "
            "whitespace, '[' or ']'."
        )


def check_text(kind: str, value: str) -> None:
    """The text rule (passages, queries, titles, document ids, filter values): any character
    but NUL, which PostgreSQL text and jsonb cannot hold (the wire schema's `TEXT_PATTERN`),
    and valid Unicode (the wire's JSON cannot carry a lone surrogate into a `str`; an
    in-process caller can)."""
    if "\x00" in value:
        raise _invalid(f"{kind} must not contain NUL characters.")
    if _SURROGATES.search(value):
        raise _invalid(f"{kind} {_NOT_UNICODE}.")


def check_metadata(metadata: Metadata) -> None:
    """Any JSON object of at most `MAX_METADATA_BYTES` of UTF-8 and `MAX_METADATA_DEPTH`
    levels, with no NUL in any key or string (the PostgreSQL store cannot keep one in
    `jsonb`, and no filter could name it)."""
    _check_tree(metadata)
    try:
        size = json_bytes(metadata)
    except (TypeError, ValueError) as exc:
        raise _invalid("metadata must be JSON (finite numbers, string keys).") from exc
    if size > MAX_METADATA_BYTES:
        raise _invalid(f"metadata must be at most {MAX_METADATA_BYTES} bytes of JSON (UTF-8).")


def json_bytes(value: object) -> int:
    """Bytes of `value` as compact JSON in UTF-8: what metadata bounds count (`é` is 2 bytes,
    not the 6 of its escape; no space after `:` or `,`)."""
    encoded = json.dumps(
        value, allow_nan=False, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return len(encoded.encode("utf-8"))


def _walk(value: object) -> Iterator[tuple[object, int]]:
    """Every value in `value` (dict keys too) with its level, the outer one 1; a stack, not
    recursion (the depth is what callers check). A container's children are reached only if
    the caller asks for more after seeing it."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        yield item, depth
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in (*item.keys(), *item.values()))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)


def _check_tree(value: object) -> None:
    for seen, (item, depth) in enumerate(_walk(value), 1):
        if seen > MAX_METADATA_BYTES:
            # Every value takes at least a byte and a separator in JSON: past this many it
            # cannot fit. Checked as it is walked (a black-box test: an in-process object
            # sharing its parts, `a = [a, a]` 30 times over, would take minutes to serialize).
            raise _invalid(f"metadata must be at most {MAX_METADATA_BYTES} bytes of JSON (UTF-8).")
        if isinstance(item, str):
            if "\x00" in item or _SURROGATES.search(item):
                raise _invalid(
                    "metadata keys and strings must not contain the NUL character or a lone "
                    "surrogate."
                )
        elif isinstance(item, dict | list | tuple):
            if depth > MAX_METADATA_DEPTH:
                raise _invalid(f"metadata must nest at most {MAX_METADATA_DEPTH} levels deep.")
            if isinstance(item, dict) and not all(isinstance(key, str) for key in item):
                raise _invalid("metadata keys must be strings.")  # json.dumps made 1 into "1"


def shown_metadata(metadata: Metadata) -> Metadata:
    """`metadata` as a reply shows it: as stored, except that containers deeper than
    `MAX_METADATA_DEPTH` (stored before that bound, which an earlier release did not have)
    become `DEEPER_THAN_SHOWN`: the wire's JSON and the client's parser stop near 200 levels,
    and such a source made every answer holding it a 500 or a client error (a black-box
    test, after an upgrade)."""
    if _depth_within(metadata):
        return metadata
    return {key: _cut(value, 2) for key, value in metadata.items()}


DEEPER_THAN_SHOWN = f"(nested deeper than {MAX_METADATA_DEPTH} levels: not shown)"


def _depth_within(value: object) -> bool:
    return all(
        depth <= MAX_METADATA_DEPTH
        for item, depth in _walk(value)
        if isinstance(item, dict | list | tuple)
    )


def _cut(value: JSONValue, depth: int) -> JSONValue:
    if not isinstance(value, dict | list):
        return value
    if depth > MAX_METADATA_DEPTH:
        return DEEPER_THAN_SHOWN
    if isinstance(value, dict):
        return {key: _cut(child, depth + 1) for key, child in value.items()}
    return [_cut(child, depth + 1) for child in value]


MAX_USER_METADATA_KEYS = 16
MAX_USER_METADATA_CHARS = 256
MAX_USER_METADATA_BYTES = 4096


def check_user_metadata(metadata: Mapping[str, object]) -> None:
    """Metadata a caller attaches to an ingested document (the wire's `metadata` parameter):
    at most 16 keys under the identifier rule, each a scalar; strings at most 256 characters
    under the text rule, numbers finite; 4 KiB of JSON (UTF-8) in all, so that it always fits
    beside what a document yields. (Prepared passages take any JSON within 16 KiB.)"""
    if len(metadata) > MAX_USER_METADATA_KEYS:
        raise _invalid(f"metadata has at most {MAX_USER_METADATA_KEYS} keys.")
    for key, value in metadata.items():
        check_id("metadata key", key)
        if isinstance(value, str):
            if len(value) > MAX_USER_METADATA_CHARS:
                raise _invalid(
                    f"metadata strings are at most {MAX_USER_METADATA_CHARS} characters."
                )
            check_text("metadata value", value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _invalid("metadata numbers must be finite.")
        elif value is not None and not isinstance(value, bool | int | float):
            raise _invalid("metadata values are strings, numbers, booleans or null.")
    if json_bytes(metadata) > MAX_USER_METADATA_BYTES:
        raise _invalid(f"metadata must be at most {MAX_USER_METADATA_BYTES} bytes of JSON (UTF-8).")


def check_location(loc: Location) -> None:
    for name in ("page", "start_line", "end_line"):
        value = getattr(loc, name)
        if value is not None and (not _whole(value) or value < 1):
            raise _invalid(f"location.{name} must be a positive integer.")
    if loc.start_line is not None and loc.end_line is not None and loc.end_line < loc.start_line:
        raise _invalid("location.endLine must not precede startLine.")
    if loc.document_id is not None:
        if not loc.document_id or len(loc.document_id) > 998:
            raise _invalid("location.documentId must be 1-998 characters.")
        check_text("location.documentId", loc.document_id)


# The shape of the ids ingestion derives (`derived_chunk_id`), reserved for them.
DERIVED_CHUNK_ID: Final = re.compile(r"p[0-9a-f]{24}")


def derived_chunk_id(source_id: str, revision: str, ordinal: int, text: str) -> str:
    """The id ingestion gives the `ordinal`-th passage (from 0) of a source revision: a
    digest of the four, the same whenever the same document is ingested again."""
    material = "\x1f".join((source_id, revision, str(ordinal), text))
    return "p" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]


def check_chunks(chunks: Sequence[ChunkInput], source_id: str, revision: str) -> None:
    """The passages of one source revision. An id of ingestion's shape is refused unless it is
    that passage's own digest (`derived_chunk_id` of this source, revision, position and text):
    the digest is public, so a writer who could index any id of that shape under a source of
    its own could test guesses of another source's whole text by the `CHUNK_ID_CONFLICT` they
    draw (a black-box test confirmed a price in a source it could neither read nor write)."""
    if not chunks:
        raise _invalid("a source revision needs at least one passage.")
    seen: set[str] = set()
    for ordinal, chunk in enumerate(chunks):
        if not isinstance(chunk, ChunkInput) or not isinstance(chunk.text, str):
            raise _invalid("passages are ChunkInput objects holding text.")
        check_chunk_id(chunk.id)
        if chunk.id in seen:
            raise _invalid("chunk ids must be unique within a source.")
        seen.add(chunk.id)
        if not chunk.text.strip():
            raise _invalid("passage text must not be empty.")
        check_text("passage text", chunk.text)
        if DERIVED_CHUNK_ID.fullmatch(chunk.id) and chunk.id != derived_chunk_id(
            source_id, revision, ordinal, chunk.text
        ):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"chunk id {chunk.id!r} has the shape of the ids ingestion derives ('p' and 24 "
                "hex digits), which is reserved for the passage whose digest it is: choose "
                "another id.",
                reason=InvalidRequestReason.RESERVED_CHUNK_ID,
            )
        check_location(chunk.location)
        for heading in chunk.section_path:
            check_text("section heading", heading)


def check_index_request(request: IndexRequest) -> None:
    check_id("corpus", request.corpus)
    check_id("source id", request.source.id)
    check_id("revision", request.source.revision)
    if not isinstance(request.source.title, str):
        raise _invalid("title must be text.")
    if len(request.source.title) > 1024:
        raise _invalid("title must be at most 1024 characters.")
    check_text("title", request.source.title)
    check_metadata(request.source.metadata)
    if request.document_sha256 is not None and (
        len(request.document_sha256) != 64
        or any(c not in "0123456789abcdef" for c in request.document_sha256)
    ):
        raise _invalid("documentSha256 must be 64 lowercase hex digits.")
    check_chunks(request.chunks, request.source.id, request.source.revision)


def _finite(value: object) -> bool:
    """A number (not a bool, not a numeric string an in-process caller passed) and finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_not_one_string(kind: str, values: Sequence[str]) -> None:
    """A `str` is a `Sequence[str]` to a type checker: `source_ids="battery-study"` searched
    sources "b", "a", "t", ... (a black-box test)."""
    if isinstance(values, str | bytes):
        raise _invalid(f"{kind} must be a list of ids, not one string.")


def cut_query(text: str) -> str:
    """The longest start of `text` a search accepts as its query (`MAX_QUERY_BYTES` of UTF-8,
    whole characters): for a query the caller did not write as one (a run's input), which a
    refusal would fail over a limit it cannot see."""
    encoded = text.encode("utf-8", errors="surrogatepass")
    if len(encoded) > MAX_QUERY_BYTES:
        text = encoded[:MAX_QUERY_BYTES].decode("utf-8", errors="ignore")
    return text.rstrip()


def check_search_request(request: SearchRequest) -> None:
    check_id("corpus", request.corpus)
    if not isinstance(request.query, str):  # in-process: bytes, a number
        raise _invalid("query must be text.")
    if not request.query.strip():
        raise _invalid("query must not be empty.")
    check_text("query", request.query)
    if len(request.query.encode("utf-8")) > MAX_QUERY_BYTES:
        raise _invalid(f"query must be at most {MAX_QUERY_BYTES} bytes of UTF-8.")
    if (
        isinstance(request.limit, bool)
        or not isinstance(request.limit, int)
        or not 1 <= request.limit <= MAX_LIMIT
    ):
        raise _invalid(f"limit must be a whole number in 1..{MAX_LIMIT}.")
    if not isinstance(request.mode, str) or request.mode not in SEARCH_MODES:
        raise _invalid("mode must be hybrid, dense or lexical.")
    if request.min_score is not None and not _finite(request.min_score):
        raise _invalid("minScore must be a finite number.")
    if request.max_context_bytes is not None and (
        not _whole(request.max_context_bytes) or request.max_context_bytes < 1
    ):
        raise _invalid("maxContextBytes must be positive.")
    if request.max_age_s is not None and (not _finite(request.max_age_s) or request.max_age_s <= 0):
        raise _invalid("maxAgeS must be a positive number of seconds.")
    if request.source_ids is not None:
        check_not_one_string("source ids", request.source_ids)
        if not isinstance(request.source_ids, Collection):  # a number, a generator
            raise _invalid("source ids must be a list of ids.")
        if len(request.source_ids) > MAX_SOURCE_IDS:
            raise _invalid(f"at most {MAX_SOURCE_IDS} sourceIds.")
        for sid in request.source_ids:
            check_id("source id", sid)
